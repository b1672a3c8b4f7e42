"""scripts/vllm_server_times.py, the instrument that timed vLLM's API server: responses
rebuilt from perf's lines of write(2) and read(2) calls, and matched to the client's requests
through an unknown clock offset, a lost request and a swapped pair of near arrivals."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import vllm_server_times as st  # noqa: E402


def perf_line(t: float, kind: str, fd: int, count: int, tid: int = 7060) -> str:
    return (f"  {tid} {t:.6f}:  syscalls:sys_enter_{kind}: fd: 0x{fd:08x}, buf: 0x55912552ca20,"
            f" count: 0x{count:08x}")  # fmt: skip


def response(t0: float, fd: int, chunks: list[float]) -> list[str]:
    """A request read at t0 on fd, its headers, token chunks at t0 + each, [DONE], the end."""
    out = [perf_line(t0, "read", fd, 256000), perf_line(t0 + 0.002, "write", fd, 163)]
    out += [perf_line(t0 + c, "write", fd, 240) for c in chunks]
    return out + [perf_line(t0 + chunks[-1], "write", fd, 19),
                  perf_line(t0 + chunks[-1], "write", fd, 5)]  # fmt: skip


def test_responses_are_rebuilt_per_connection_and_other_writes_are_ignored():
    lines = [perf_line(100.0, "write", 22, 8),  # an eventfd
             perf_line(100.01, "write", 1, 120)]  # a log line on stdout: no request read
    lines += response(100.1, 25, [0.05, 0.06, 0.07])
    lines += response(100.12, 26, [0.04, 0.3])  # interleaved on another connection
    lines += response(100.5, 25, [0.02])  # the same connection again (keep-alive)
    got = st.parse("\n".join(sorted(lines, key=lambda x: float(x.split()[1].rstrip(":")))))
    assert [r["read_s"] for r in got] == [100.1, 100.12, 100.5]
    assert got[0]["chunk_s"] == pytest.approx([100.15, 100.16, 100.17])
    assert got[1]["chunk_s"] == pytest.approx([100.16, 100.42])
    assert got[2]["end_s"] == pytest.approx(100.52)


def test_a_response_without_the_chunked_end_is_over_at_the_next_read_on_its_fd():
    """A /metrics GET answered with a length (three writes, no chunked end), its connection
    closed (a read of its end) and its fd given to the next request's connection: that
    request is read at its own time, with its own chunks only (before: lost, its writes
    counted as the /metrics response's)."""
    lines = [perf_line(200.0, "read", 30, 256000), perf_line(200.001, "write", 30, 150),
             perf_line(200.002, "write", 30, 4096), perf_line(200.003, "write", 30, 900),
             perf_line(200.01, "read", 30, 256000)]  # fmt: skip
    lines += response(200.05, 30, [0.04, 0.05])
    got = st.parse("\n".join(lines))
    assert [r["read_s"] for r in got] == [200.05]
    assert got[0]["chunk_s"] == pytest.approx([200.09, 200.10])


def test_requests_are_matched_through_the_clock_offset_a_lost_one_and_a_late_read():
    """The server's clock is the client's plus 5000 s; each read 0.3 ms after sending but
    one, read 20 ms late (the server busy), and one whose response never finished."""
    sent = [0.0, 0.25, 0.27, 0.9, 1.4, 2.0]
    delay = [0.0003, 0.0003, 0.0203, 0.0003, 0.0003, 0.0003]
    found = [{"read_s": 5000 + s + d, "chunk_s": [5000 + s + d + 0.05], "end_s": 0.0}
             for i, (s, d) in enumerate(zip(sent, delay, strict=True)) if i != 4]  # fmt: skip
    offset, got = st.match(sent, found)
    assert offset == pytest.approx(5000.0003)
    assert [g is None for g in got] == [False, False, False, False, True, False]
    assert got[2]["read_s"] == pytest.approx(5000.2903)  # its own, not its neighbour's
    assert math.isnan(st.match(sent, [])[0])
