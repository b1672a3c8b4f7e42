#!/usr/bin/env python3
"""Issue 28's "done when": the commands a newcomer types first, on a quiet machine and again
under load (two other test suites running), and whether each ends with a number and a
conclusion that agree with the quiet run's within the noise the run reports.

    python3 scripts/newcomer_check.py --out DIR            # both passes, then the table
    python3 scripts/newcomer_check.py --out DIR --compare  # the table of passes already run

Each pass runs `benchbatch phases`, `sweep`, `occupancy`, `serve-sweep` and `reproduce`
(the README's first command) with their defaults into DIR/quiet/<command> and
DIR/loaded/<command>. The load: two clones of this checkout, each running `python3 -m
pytest` (started first, stopped by their process groups at the end). With both passes the
two conditions alternate command by command, the order flipped each command (phases quiet
then loaded, sweep loaded then quiet, ...): for a quiet run the suites are paused
(SIGSTOP to their process groups, SIGCONT after), so drift over the passes falls on both
alike. A command's folder that holds an earlier run's results is refused unless --force
(passes.json keeps the other commands' rows); an existing comparison.md is kept and the
table goes to comparison-2.md, ... unless --force. The comparison (printed):
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

from script_common import new_name

from benchbatch.core.units import figure

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("phases", "sweep", "occupancy", "serve-sweep", "reproduce")
NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")


def load() -> float:
    return os.getloadavg()[0]


def earlier(folder: Path, commands: tuple[str, ...]) -> list[str]:
    """The commands with an earlier run's results under this pass: their log, or a folder
    with something in it."""
    return [c for c in commands if (folder / f"{c}.txt").exists()
            or (folder / c).is_dir() and any((folder / c).iterdir())]  # fmt: skip


def run_pass(folder: Path, commands: tuple[str, ...] = COMMANDS) -> list[dict]:
    """Run the commands into folder/<command> (an earlier run's folder removed: main
    refused it without --force), and merge their rows into folder/passes.json."""
    folder.mkdir(parents=True, exist_ok=True)
    done = []
    for cmd in commands:
        out = folder / cmd
        shutil.rmtree(out, ignore_errors=True)  # only what --force allowed
        before, t0 = load(), time.monotonic()
        with open(folder / f"{cmd}.txt", "w") as log:
            cmdline = [sys.executable, "-m", "benchbatch", cmd, "--out", str(out)]
            rc = subprocess.run(cmdline, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
        row = {"command": cmd, "rc": rc, "wall_s": round(time.monotonic() - t0, 1),
               "load_before": before, "load_after": load()}  # fmt: skip
        print(json.dumps({"pass": folder.name, **row}), flush=True)
        done.append(row)
    kept = []
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads((folder / "passes.json").read_text())
    rerun = {r["command"] for r in done}
    merged = [r for r in kept if r.get("command") not in rerun] + done
    merged.sort(key=lambda r: COMMANDS.index(r["command"]) if r["command"] in COMMANDS else 99)
    (folder / "passes.json").write_text(json.dumps(merged, indent=1))
    return done


@contextlib.contextmanager
def two_suites(work: Path):
    """Two clones of HEAD, each running the test suite; stopped by process group at the end.
    Yields hold(running): SIGCONT (True) or SIGSTOP (False) to both suites' process groups."""
    procs = []

    def hold(running: bool) -> None:
        for proc, _ in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT if running else signal.SIGSTOP)

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
        yield hold
    finally:
        hold(True)  # a stopped suite would not act on its SIGTERM
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


def num(value) -> float:
    """A range's end as a float (a whole number read back from JSON too); NaN where missing."""
    return float(value) if isinstance(value, (int, float)) else math.nan


def end_text(value: float) -> str:
    return "-" if math.isnan(value) else figure(value)


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
        ends = [num(r.get(k)) for r in (q, lo) for k in ("knee_rps_slow", "knee_rps_fast")]
        overlap = ranges_overlap((ends[0], ends[1]), (ends[2], ends[3]))
        said = "-" if overlap is None else "yes" if overlap else "NO"
        q_end, lo_end = (f"{end_text(a)}-{end_text(b)}" for a, b in (ends[:2], ends[2:]))
        lines.append(f"| {policy} | {figure(q['knee_rps'])} ({q_end}) | {figure(lo['knee_rps'])} "
                     f"({lo_end}) | {lo['knee_rps'] / q['knee_rps']:.2f} | {said} |")  # fmt: skip
    return lines


def verdicts(folder: Path) -> dict[str, str]:
    path = folder / "reproduce" / "result.json"
    if not path.exists():
        return {}
    claims = json.loads(path.read_text()).get("metrics", {}).get("claims") or []
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for both passes")
    p.add_argument("--compare", action="store_true", help="only compare passes already run")
    p.add_argument("--only", choices=("quiet", "loaded"), help="run one pass only")
    p.add_argument("--commands", default=",".join(COMMANDS),
                   help=f"comma-separated, of {', '.join(COMMANDS)} (default all)")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="rerun commands whose folders hold results; overwrite comparison.md")
    args = p.parse_args(argv)
    commands = tuple(c.strip() for c in args.commands.split(",") if c.strip())
    if not commands or set(commands) - set(COMMANDS):
        p.error(f"--commands: choose from {', '.join(COMMANDS)}")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out: {args.out} is a file; choose a folder")
    passes = () if args.compare else (args.only,) if args.only else ("quiet", "loaded")
    for name in passes:
        if (found := earlier(args.out / name, commands)) and not args.force:
            p.error(f"--out: {args.out / name} already holds {', '.join(found)}; choose another "
                    "folder or pass --force")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only == "quiet":
        print(f"quiet pass (load {load():.2f})", flush=True)
        run_pass(args.out / "quiet", commands)
    elif passes:  # the loaded pass alone, or both alternating command by command
        with tempfile.TemporaryDirectory() as work, two_suites(Path(work)) as hold:
            print(f"suites started (load {load():.2f})", flush=True)
            for i, cmd in enumerate(commands):
                for name in passes if i % 2 == 0 else passes[::-1]:
                    hold(name == "loaded")
                    run_pass(args.out / name, (cmd,))
    text = compare(args.out)
    path = args.out / "comparison.md"
    path = path if args.force else new_name(path)
    path.write_text(text + "\n")
    print(text)
    print(f"\ncomparison: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
