"""Start several ranks of a command as torchrun starts them, bounded in time.

Each rank is its own process with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so a test sees every rank's exit code and output; a launch that
outlives its timeout is killed (every rank's process group) and fails the test, so no hang
can stall CI. `torchrun` itself is started by the Ctrl-C test (tests/test_tensor_parallel.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Rank:
    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    path = env.get("PYTHONPATH")
    env |= {
        "PYTHONPATH": str(REPO) + (os.pathsep + path if path else ""),
        "OMP_NUM_THREADS": "1",  # as torchrun sets it: two ranks on two cores
        "MPLBACKEND": "Agg",
        "COLUMNS": "120",
    }
    return env | (extra or {})


def launch(args: list[str], cwd: Path, ranks: int = 2, timeout: float = 120,
           env: dict | None = None) -> list[Rank]:  # fmt: skip
    """`python ARGS` on `ranks` ranks; every rank's exit code and output (env: more of the
    environment, for every rank)."""
    port = free_port()
    procs = []
    extra = env or {}
    for r in range(ranks):
        env = environment(
            extra | {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(ranks),
                "LOCAL_WORLD_SIZE": str(ranks),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return [_wait(p, procs, timeout) for p in procs]


def _wait(proc: subprocess.Popen, procs: list[subprocess.Popen], timeout: float) -> Rank:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            kill(p)
        out, err = proc.communicate()
        pytest.fail(f"a rank did not finish within {timeout} s:\n{out}\n{err}")
    return Rank(proc.returncode, out, err)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group this test started (each rank leads its own)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
