"""What HTTP costs: benchbatch's engine served in-process (serve-sweep --engine real) and the
same engine behind its OpenAI-compatible server (benchbatch serve, measured by serve-sweep
--endpoint), on the same checkpoint, the same requests and the same arrival times,
alternating, the order flipped each run (A B, B A, ...). Prints the medians of each and B
over A, with the machine and the load average before and after each run (also columns of
http_cost.csv).

    python3 scripts/http_cost.py [--runs 3] [--rate 4] [--model DIR] [--out DIR [--force]]

Without --model it makes the tiny Llama checkpoint of scripts/tiny_checkpoint.py. A
non-empty --out (an earlier run's) is refused unless --force. A benchmark, not a test: on a
shared machine read the ratios of the medians, not one run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
from script_common import fresh_folder, load_now, machine, positive_float, positive_int, run_child

ROOT = Path(__file__).resolve().parent.parent
BB = [sys.executable, "-m", "benchbatch.app.start"]
METRICS = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
           "output_throughput_tps")  # fmt: skip


def workload(args) -> list[str]:
    return ["--requests", str(args.requests), "--real-requests", str(args.requests),
            "--prompt-dist", "fixed", "--prompt-len", str(args.prompt), "--output-dist",
            "fixed", "--output-median", str(args.output), "--max-output", str(args.output),
            "--slots", str(args.slots), "--seed", "0", "--policies", "continuous"]  # fmt: skip


def in_process(args, out: Path) -> dict:
    cmd = [*BB, "serve-sweep", "--model", str(args.model), "--rates", str(args.rate),
           "--real-rates", str(args.rate), *workload(args), "--out", str(out),
           *forced(out)]  # fmt: skip
    run_child(cmd, f"serve-sweep into {out}")
    df = pd.read_csv(out / "serve.csv")
    return df[df["source"] == "real"].iloc[0].to_dict()


def served(args, out: Path) -> dict:
    cmd = [*BB, "serve", "--model", str(args.model), "--policy", "continuous", "--slots",
           str(args.slots), "--port", "0", "--out", str(out / "server"),
           *forced(out / "server")]  # fmt: skip
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url = None
        for line in server.stderr:
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise SystemExit(f"benchbatch serve did not start (exit {server.wait()})")
        # the rest of its stderr read on the side: a full pipe would stop the server mid-run
        threading.Thread(target=server.stderr.read, daemon=True).start()
        sweep = [*BB, "serve-sweep", "--endpoint", url, "--rates", str(args.rate),
                 *workload(args), "--out", str(out / "client"),
                 *forced(out / "client")]  # fmt: skip
        run_child(sweep, f"serve-sweep --endpoint into {out / 'client'}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # by its process id, never by name
        server.wait(300)
    df = pd.read_csv(out / "client" / "serve.csv")
    return df[df["source"] == "endpoint"].iloc[0].to_dict()


def forced(out: Path) -> list[str]:
    """--force for a run folder that is there (only after this script's own --force)."""
    return ["--force"] if out.exists() else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=positive_int, default=3, help="A B pairs (default 3)")
    p.add_argument("--rate", type=positive_float, default=4.0,
                   help="requests per second (default 4)")  # fmt: skip
    p.add_argument("--requests", type=positive_int, default=40, help="requests a run (default 40)")
    p.add_argument("--prompt", type=positive_int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--output", type=positive_int, default=16, help="output tokens (default 16)")
    p.add_argument("--slots", type=positive_int, default=8, help="max_num_seqs (default 8)")
    p.add_argument("--model", type=Path, help="a checkpoint folder (default: the tiny Llama)")
    p.add_argument("--out", type=Path, help="where the runs and http_cost.csv go")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    args = p.parse_args()
    if args.model is not None and not (args.model / "config.json").is_file():
        p.error(f"--model: no config.json in {args.model}")
    out = fresh_folder(p, args.out, args.force) if args.out else None
    work = Path(out or tempfile.mkdtemp(prefix="http-cost-"))
    if args.model is None:
        args.model = work / "tiny-llama"
        if not (args.model / "config.json").exists():
            make = [sys.executable, str(ROOT / "scripts" / "tiny_checkpoint.py"), str(args.model)]
            subprocess.run(make, check=True)
    rows, start, host = [], time.monotonic(), machine()
    sides = (("in-process", in_process), ("served", served))
    for i in range(args.runs):
        for name, run in sides if i % 2 == 0 else sides[::-1]:
            out = work / f"{name}-{i}"
            before = load_now()
            row = run(args, out)
            rows.append({"run": i, "engine": name, **{k: row[k] for k in METRICS},
                         "load_before": before, "load_after": load_now()})  # fmt: skip
            print(f"[{time.monotonic() - start:5.0f} s] {name} run {i}: TTFT p50 "
                  f"{1e3 * row['ttft_p50_s']:.1f} ms, TPOT p50 {1e3 * row['tpot_p50_s']:.1f} ms",
                  flush=True)  # fmt: skip
    df = pd.DataFrame(rows)
    df.to_csv(work / "http_cost.csv", index=False)
    med = df.groupby("engine")[list(METRICS)].median()
    table = med.T.assign(served_over_in_process=med.loc["served"] / med.loc["in-process"])
    print(f"\nmedians of {args.runs} alternating runs at {args.rate:g} req/s, {args.requests} "
          f"requests of {args.prompt} prompt / {args.output} output tokens; {host['cpu']}, "
          f"{host['cpus']} logical CPUs, load {df['load_before'].min():.1f}-"
          f"{df['load_after'].max():.1f}:")  # fmt: skip
    print(table.to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"\nrows: {work / 'http_cost.csv'}")


if __name__ == "__main__":
    main()
