#!/usr/bin/env python3
"""Issue 28's "done when": the commands a newcomer types first, on a quiet machine and again
under load (two other test suites running), and whether each ends with a number and a
conclusion that agree with the quiet run's within the noise the run reports.

    python3 scripts/newcomer_check.py --out DIR            # both passes, then the table
    python3 scripts/newcomer_check.py --out DIR --compare  # the table of passes already run

Each pass runs `benchbatch phases`, `sweep`, `occupancy`, `serve-sweep` and `reproduce`
(the README's first command) with their defaults into DIR/quiet/<command> and
DIR/loaded/<command>. The load: two clones of this checkout, each running `python3 -m
pytest` (started before the loaded pass, stopped by their process groups after it). The
comparison (DIR/comparison.md, printed):
- phases and sweep: each step's median under load against the quiet run's p10-p90 (the
  noise both report): agree when the two runs' p10-p90 ranges overlap;
- every command: its conclusion lines (the sentences after the tables) with their numbers,
  side by side; occupancy's are exact (a simulation), the others are judged by the rows;
- serve-sweep: each simulated policy's SLO knee with its range (every step priced 10% slower
  and faster): agree when the two runs' ranges overlap;
- reproduce: each claim's verdict (holds, fails, ...) the same in both.
Nothing here is a test: the machine is shared, so this is a measurement to quote.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchbatch.core.units import figure

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("phases", "sweep", "occupancy", "serve-sweep", "reproduce")
NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")


def load() -> float:
    return os.getloadavg()[0]


def run_pass(folder: Path, commands: tuple[str, ...] = COMMANDS) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    done = []
    for cmd in commands:
        out = folder / cmd
        shutil.rmtree(out, ignore_errors=True)
        before, t0 = load(), time.monotonic()
        with open(folder / f"{cmd}.txt", "w") as log:
            cmdline = [sys.executable, "-m", "benchbatch", cmd, "--out", str(out)]
            rc = subprocess.run(cmdline, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
        row = {"command": cmd, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
               "load_before": before, "load_after": load()}  # fmt: skip
        print(json.dumps(row), flush=True)
        done.append(row)
    (folder / "passes.json").write_text(json.dumps(done, indent=1))
    return done


@contextlib.contextmanager
def two_suites(work: Path):
    """Two clones of HEAD, each running the test suite; stopped by process group at the end."""
    procs = []
    try:
        for i in range(2):
            clone = work / f"suite{i}"
            shutil.rmtree(clone, ignore_errors=True)
            subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
            log = open(work / f"suite{i}.log", "w")  # noqa: SIM115 (closed with the process)
            env = os.environ | {"PYTHONPATH": str(clone)}
            suite = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            proc = subprocess.Popen(suite, cwd=clone, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)  # fmt: skip
            procs.append((proc, log))
        time.sleep(60)  # a benchmark's warm-up of the load, not a test's wait
        yield
    finally:
        for proc, log in procs:
            for sig in (signal.SIGTERM, signal.SIGKILL):  # a suite may outlive its SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.close()


def conclusions(text: str) -> list[str]:
    """The lines a run ends with that state something: not the tables, progress, notes."""
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "─│┃━" or re.match(r"^\S+: \d+/\d+ ", s) or s.startswith("note:"):
            continue
        if s.startswith(("results:", "estimated duration", "context ")) or "|" in s:
            if not s.startswith("context "):
                continue
        if re.search(r"\S {2,}\S", s):  # a table's row: its columns are runs of spaces
            continue
        if s.count(")") > s.count("("):  # the tail of a line the terminal wrapped
            continue
        if NUMBER.search(s) and re.search(r"[a-z]{3,}", s) and len(s.split()) > 4:
            keep.append(s)
    return keep[-8:]


def rows_of(folder: Path, cmd: str) -> list[dict]:
    path = folder / cmd / "result.json"
    if not path.exists():
        return []
    return json.loads(path.read_text()).get("metrics", {}).get("rows") or []


def steps_agree(quiet: list[dict], loaded: list[dict]) -> list[dict]:
    """Per step: both medians, both p10-p90, and whether the ranges overlap."""
    by = {r.get("label") or (r.get("context"), r.get("batch")): r for r in quiet}
    out = []
    for r in loaded:
        key = r.get("label") or (r.get("context"), r.get("batch"))
        q = by.get(key)
        if q is None or "step_ms_p10" not in r or "step_ms_p10" not in q:
            continue
        overlap = r["step_ms_p10"] <= q["step_ms_p90"] and q["step_ms_p10"] <= r["step_ms_p90"]
        out.append({"step": str(key), "quiet_ms": q["step_ms"], "loaded_ms": r["step_ms"],
                    "ratio": r["step_ms"] / q["step_ms"],
                    "quiet_p10_p90": f"{figure(q['step_ms_p10'])}-{figure(q['step_ms_p90'])}",
                    "loaded_p10_p90": f"{figure(r['step_ms_p10'])}-{figure(r['step_ms_p90'])}",
                    "agree": overlap})  # fmt: skip
    return out


RATIOS = {
    "phases": ("prefill_over_decode_tflops", "decode_token_cost_ratio"),
    "sweep": ("throughput_ratio", "step_latency_ratio"),
}


def ratios(folder: Path, cmd: str) -> dict[str, tuple[float, float, float]]:
    """The ratios a command concludes with: (value, low, high) from its result.json."""
    path = folder / cmd / "result.json"
    if not path.exists():
        return {}
    summary = json.loads(path.read_text()).get("metrics", {}).get("summary") or {}
    summary = summary[0] if isinstance(summary, list) and summary else summary
    return {k: (summary[k], summary.get(f"{k}_low", math.nan), summary.get(f"{k}_high", math.nan))
            for k in RATIOS[cmd] if k in summary}  # fmt: skip


def ratios_agree(quiet: dict, loaded: dict) -> list[str]:
    """Per ratio: both values with their p10-p90 ranges, and whether the ranges overlap."""
    from benchbatch.output.compare_serve import ranges_overlap

    lines = []
    for key in quiet.keys() & loaded.keys():
        (q, q_lo, q_hi), (v, lo, hi) = quiet[key], loaded[key]
        overlap = ranges_overlap((q_lo, q_hi), (lo, hi))
        said = "-" if overlap is None else "yes" if overlap else "NO"
        lines.append(f"| {key} | {figure(q)} ({figure(q_lo)}-{figure(q_hi)}) | {figure(v)} "
                     f"({figure(lo)}-{figure(hi)}) | {v / q:.2f} | {said} |")  # fmt: skip
    return sorted(lines)


def knees(folder: Path) -> dict[str, dict]:
    path = folder / "serve-sweep" / "result.json"
    if not path.exists():
        return {}
    slo = json.loads(path.read_text()).get("metrics", {}).get("slo") or []
    return {r["policy"]: r for r in slo if r.get("source") == "sim" and r.get("knee_rps")}


def knees_agree(quiet: dict[str, dict], loaded: dict[str, dict]) -> list[str]:
    """Per policy: both knees with their ranges, and whether the ranges overlap (as
    `benchbatch compare` judges them)."""
    from benchbatch.output.compare_serve import ranges_overlap

    lines = []
    for policy in dict.fromkeys([*quiet, *loaded]):
        q, lo = quiet.get(policy), loaded.get(policy)
        if not q or not lo:
            shown = [f"{figure(r['knee_rps'])}" if r else "none" for r in (q, lo)]
            lines.append(f"| {policy} | {shown[0]} | {shown[1]} | - | - |")
            continue
        overlap = ranges_overlap((q["knee_rps_slow"], q["knee_rps_fast"]),
                                 (lo["knee_rps_slow"], lo["knee_rps_fast"]))  # fmt: skip
        lines.append(f"| {policy} | {figure(q['knee_rps'])} ({figure(q['knee_rps_slow'])}-"
                     f"{figure(q['knee_rps_fast'])}) | {figure(lo['knee_rps'])} "
                     f"({figure(lo['knee_rps_slow'])}-"
                     f"{figure(lo['knee_rps_fast'])}) | {lo['knee_rps'] / q['knee_rps']:.2f} | "
                     f"{'yes' if overlap else 'NO'} |")  # fmt: skip
    return lines


def verdicts(folder: Path) -> dict[str, str]:
    path = folder / "reproduce" / "result.json"
    if not path.exists():
        return {}
    metrics = json.loads(path.read_text()).get("metrics", {})
    claims = metrics.get("claims") or metrics.get("verdicts") or []
    if isinstance(claims, dict):
        return {k: str(v.get("verdict") if isinstance(v, dict) else v) for k, v in claims.items()}
    return {f"{c.get('key')}: {c.get('claim')}": f"{c.get('verdict')} ({c.get('measured')})"
            for c in claims}  # fmt: skip


def compare(out: Path) -> str:
    quiet, loaded = out / "quiet", out / "loaded"
    lines = ["# Newcomer commands: quiet against loaded", ""]
    for name, folder in (("quiet", quiet), ("loaded", loaded)):
        with contextlib.suppress(OSError, ValueError):
            runs = json.loads((folder / "passes.json").read_text())
            lines.append(f"{name}: " + ", ".join(
                f"{r['command']} rc {r['rc']} {r['wall_s']} s (load {r['load_before']:.1f}-"
                f"{r['load_after']:.1f})" for r in runs))  # fmt: skip
    lines.append("")
    for cmd in ("phases", "sweep"):
        rows = steps_agree(rows_of(quiet, cmd), rows_of(loaded, cmd))
        lines += [f"## {cmd}: steps", "",
                  "| step | quiet ms | loaded ms | loaded/quiet | quiet p10-p90 | loaded p10-p90 "
                  "| ranges overlap |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            agree = "yes" if r["agree"] else "NO"
            lines.append(f"| {r['step']} | {figure(r['quiet_ms'])} | {figure(r['loaded_ms'])} | "
                         f"{r['ratio']:.2f} | {r['quiet_p10_p90']} | {r['loaded_p10_p90']} | "
                         f"{agree} |")  # fmt: skip
        lines.append("")
    for cmd in RATIOS:
        r = ratios_agree(ratios(quiet, cmd), ratios(loaded, cmd))
        if r:
            lines += [f"## {cmd}: the ratios it concludes with (ranges: the steps' p10-p90)", "",
                      "| ratio | quiet | loaded | loaded/quiet | ranges overlap |",
                      "|---|---|---|---|---|", *r, ""]  # fmt: skip
    k = knees_agree(knees(quiet), knees(loaded))
    if k:
        lines += ["## serve-sweep: simulated SLO knees (req/s; steps priced 10% slower-faster)", "",
                  "| policy | quiet | loaded | loaded/quiet | ranges overlap |",
                  "|---|---|---|---|---|", *k, ""]  # fmt: skip
    v_q, v_l = verdicts(quiet), verdicts(loaded)
    if v_q or v_l:
        lines += ["## reproduce: verdicts", "", "| claim | quiet | loaded |", "|---|---|---|"]
        lines += [f"| {k} | {v_q.get(k)} | {v_l.get(k)} |" for k in dict.fromkeys([*v_q, *v_l])]
        lines.append("")
    for cmd in COMMANDS:
        lines += [f"## {cmd}: conclusions", ""]
        for name, folder in (("quiet", quiet), ("loaded", loaded)):
            with contextlib.suppress(OSError):
                text = (folder / f"{cmd}.txt").read_text(errors="replace")
                lines += [f"- {name}: {c}" for c in conclusions(text)]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for both passes")
    p.add_argument("--compare", action="store_true", help="only compare passes already run")
    p.add_argument("--only", choices=("quiet", "loaded"), help="run one pass only")
    p.add_argument("--commands", default=",".join(COMMANDS),
                   help=f"comma-separated, of {', '.join(COMMANDS)} (default all)")  # fmt: skip
    args = p.parse_args()
    commands = tuple(c.strip() for c in args.commands.split(",") if c.strip())
    if not commands or set(commands) - set(COMMANDS):
        p.error(f"--commands: choose from {', '.join(COMMANDS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.compare:
        if args.only in (None, "quiet"):
            print(f"quiet pass (load {load():.2f})", flush=True)
            run_pass(args.out / "quiet", commands)
        if args.only in (None, "loaded"):
            with tempfile.TemporaryDirectory() as work, two_suites(Path(work)):
                print(f"loaded pass (load {load():.2f})", flush=True)
                run_pass(args.out / "loaded", commands)
    text = compare(args.out)
    (args.out / "comparison.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
