"""A generated attack on the command line: at least 1,000 hostile cases over the families of
issue 29 (numbers written in other ways, input files of every bad kind, checkpoints, --out
folders, environment variables a launcher sets, terminal geometry and encodings, pipes that
close early, full disks, signals at random instants), each run as a user runs the program
(`python -m benchbatch ...`, a process of its own, under a time limit and a memory limit).

A case passes when the program ends by itself (no hang) within its memory (no kill), with
an exit code of 0, 1, 2 or 130 and no traceback; a refusal (2) is one line naming an
option; a run folder it made says how it ended (never "running"); and every file it was
given, and every file of the user's beside them, is byte for byte what it was (nothing
lost). Seeded: the same --seed gives the same cases.

    python3 scripts/hostile_attack.py [--cases 1200] [--seed 29] [--jobs 2] [--out DIR]

Prints one line per failing case and a summary table; writes DIR/cases.jsonl (every case:
its command, environment, outcome) and DIR/summary.md. Not a test: it takes minutes and
sends signals on the wall clock.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120
MEMORY_BYTES = 6 * 2**30  # far above any refused case; a case that reaches it is unbounded
OK_CODES = {0, 1, 2, 130}

NUMBERS = ["", " ", "0", "-1", "-0", "1_000", "\u0661\u0662", "\uff11\uff12", "0x10", "1e999",
           "1e-320", "1e300", "nan", "inf", "-inf", "9" * 400, "1,,2", ",", "1.5", "2**10",
           "1e3", "+3", "3 ", " 3", "1;2", "1 2", "\u00a03", "3\x01", "-1e-9", "0.0"]  # fmt: skip

# Cheap runs each option is tried on (a valid command that finishes in about a second).
BASES = {
    "occupancy": ["occupancy", "--requests", "20", "--slots", "4", "--max-output", "30"],
    "serve-sweep": ["serve-sweep", "--engine", "sim", "--requests", "20", "--rates", "1,max",
                    "--step-costs", "{costs}"],
    "ablation": ["ablation", "--requests", "10", "--step-costs", "{costs}"],
    "project": ["project", "--tp", "1,2"],
    "phases": ["phases", "--preset", "tiny", "--prefill", "8", "--decode-batch", "1",
               "--context", "8", "--no-roofline", "--repeats", "1", "--min-time", "0",
               "--warmup", "0"],
    "sweep": ["sweep", "--preset", "tiny", "--batch", "1,2", "--context", "8", "--no-roofline",
              "--repeats", "1", "--min-time", "0", "--warmup", "0"],
}  # fmt: skip
NUMBER_OPTIONS = {
    "occupancy": ["--requests", "--slots", "--median", "--sigma", "--max-output", "--prompt-len",
                  "--arrival-rate", "--kv-memory", "--block-size", "--seeds", "--seed",
                  "--long-prompt-fraction", "--long-prompt-len"],
    "serve-sweep": ["--rates", "--real-rates", "--slo-ttft", "--slo-tpot", "--real-requests",
                    "--real-time", "--max-num-batched-tokens", "--chunk-size", "--prompt-sigma",
                    "--min-prompt", "--max-prompt", "--min-output", "--burstiness",
                    "--max-concurrency"],
    "ablation": ["--max-num-batched-tokens", "--chunk-size", "--slo-ttft", "--slo-tbt",
                 "--arrival-rate"],
    "project": ["--tp", "--decode-batch", "--context", "--efficiency", "--memory-gib",
                "--nvlink-gbps", "--busbw", "--allreduce-latency-us"],
    "phases": ["--prefill", "--decode-batch", "--context", "--repeats", "--min-time", "--warmup",
               "--threads", "--block-size", "--hidden", "--layers", "--heads", "--max-context"],
    "sweep": ["--batch", "--context", "--knee-threshold"],
}  # fmt: skip
FILE_OPTIONS = {
    "occupancy": ["--trace"],
    "serve-sweep": ["--step-costs", "--trace"],
    "ablation": ["--step-costs", "--trace"],
    "project": ["--ceilings", "--config"],
    "phases": ["--ceilings", "--config", "--model"],
}
ENVIRONMENTS = [
    {"MPLBACKEND": "nonsense"}, {"MPLBACKEND": ""}, {"COLUMNS": "0"}, {"COLUMNS": "1"},
    {"COLUMNS": "100000"}, {"COLUMNS": "abc"}, {"LINES": "-5"}, {"TERM": "dumb"},
    {"PYTHONIOENCODING": "ascii"}, {"PYTHONIOENCODING": "latin-1"}, {"LANG": "C", "LC_ALL": "C"},
    {"RANK": "0"}, {"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    {"RANK": "0", "WORLD_SIZE": "0", "LOCAL_RANK": "0"},
    {"RANK": "5", "WORLD_SIZE": "2", "LOCAL_RANK": "5"}, {"WORLD_SIZE": "-3"},
    {"BENCHBATCH_CACHE_DIR": "{file}"}, {"BENCHBATCH_CACHE_DIR": "/proc/nonexistent"},
    {"HOME": "{missing}"}, {"XDG_CONFIG_HOME": "{file}"}, {"MPLCONFIGDIR": "{file}"},
    {"CUDA_VISIBLE_DEVICES": "garbage"}, {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "abc"},
    {"TORCH_LOGS": "garbage"}, {"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}, {"TMPDIR": "{file}"},
]  # fmt: skip


@dataclasses.dataclass
class Case:
    family: str
    args: list[str]
    env: dict = dataclasses.field(default_factory=dict)
    stdout: str = "pipe"  # pipe, closed (the reader goes away at once), full (/dev/full)
    stderr: str = "pipe"
    signal_after_s: float | None = None
    signal_name: str = "SIGINT"
    out: str | None = None  # the run folder it may make
    inputs: list[str] = dataclasses.field(default_factory=list)  # files that must not change


# --- the files the cases are given ----------------------------------------------------------


def make_files(root: Path) -> dict[str, Path]:
    """Every kind of bad input file, once, under root."""
    f = {}

    def put(name: str, data: bytes | str) -> None:
        path = root / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        f[name] = path

    put("costs.csv", "decode_tokens,prefill_tokens,context_tokens,step_ms\n"
        + "".join(f"{d},{p},{c},{1 + 0.05 * d + 0.01 * p + 0.0005 * c}\n"
                  for d in (1, 4, 8) for p in (0, 16, 64) for c in (0, 256)))  # fmt: skip
    put("empty.csv", "")
    put("header_only.csv", "output_tokens\n")
    put("nan.csv", "output_tokens\nnan\ninf\n")
    put("negative.csv", "output_tokens,prompt_tokens\n-5,3\n")
    put("huge_int.csv", "output_tokens\n" + "9" * 400 + "\n")
    put("big_output.csv", "output_tokens\n10000000\n")
    put("binary.csv", bytes(range(256)) * 40)
    put("utf16.csv", "\ufeffoutput_tokens\n5\n".encode("utf-16"))
    put("bom.csv", "\ufeffoutput_tokens\n5\n7\n")
    put("long_line.csv", "output_tokens," + "x" * 2_000_000 + "\n5,1\n")
    put("many_columns.csv", ",".join(f"c{i}" for i in range(5000)) + "\n")
    put("text.txt", "hello\n")
    put("deep.json", "[" * 100_000 + "]" * 100_000)
    put("not_json.json", "{not json")
    put("config_wrong_types.json", json.dumps({"hidden_size": "big", "num_hidden_layers": -1}))
    huge = {"hidden_size": 10**12, "num_hidden_layers": 10**9, "num_attention_heads": 1,
            "vocab_size": 10, "intermediate_size": 10, "model_type": "llama"}
    put("config_huge.json", json.dumps(huge))
    put("probe_bad.csv", "kind,n,tflops\nmatmul,1,nan\n")
    put("trace_ok.csv", "output_tokens,prompt_tokens\n5,3\n9,2\n")
    (root / "a_dir").mkdir()
    f["a_dir"] = root / "a_dir"
    loop = root / "loop.csv"
    loop.symlink_to(loop.name)  # a file that points at itself
    f["loop.csv"] = loop
    (root / "ping.csv").symlink_to("pong.csv")
    (root / "pong.csv").symlink_to("ping.csv")
    f["ping.csv"] = root / "ping.csv"
    fifo = root / "fifo.csv"
    os.mkfifo(fifo)  # reading it waits forever: the program must not try
    f["fifo.csv"] = fifo
    f["dev_zero"] = Path("/dev/zero")
    f["dev_null"] = Path("/dev/null")
    f["missing"] = root / "missing.csv"
    f["too_long"] = root / ("x" * 300 + ".csv")
    f["deep_path"] = Path("/" + "/".join(["d" * 200] * 30))
    f.update(make_checkpoints(root))
    return f


def make_checkpoints(root: Path) -> dict[str, Path]:
    """A tiny real checkpoint (transformers, random weights) and broken copies of it."""
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:  # without the test extra: no checkpoint cases
        return {}
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                      max_position_embeddings=128)  # fmt: skip
    good = root / "ckpt"
    LlamaForCausalLM(cfg).save_pretrained(good)
    out = {"ckpt": good}
    weights = good / "model.safetensors"
    raw = weights.read_bytes()

    def variant(name: str, change) -> None:
        path = root / name
        shutil.copytree(good, path)
        change(path)
        out[name] = path

    variant("ckpt_truncated",
            lambda p: (p / "model.safetensors").write_bytes(raw[: len(raw) // 3]))  # fmt: skip
    variant("ckpt_header_len", lambda p: (p / "model.safetensors").write_bytes(
        (2**62).to_bytes(8, "little") + raw[8:]))
    variant("ckpt_header_json", lambda p: (p / "model.safetensors").write_bytes(
        raw[:8] + b"{" * int.from_bytes(raw[:8], "little")))
    variant("ckpt_no_weights", lambda p: (p / "model.safetensors").unlink())
    variant("ckpt_empty_weights", lambda p: (p / "model.safetensors").write_bytes(b""))
    variant("ckpt_bad_config", lambda p: (p / "config.json").write_text("{"))
    variant("ckpt_arch", lambda p: (p / "config.json").write_text(
        (good / "config.json").read_text().replace("LlamaForCausalLM", "GPT2LMHeadModel")))
    variant("ckpt_eos", lambda p: (p / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 10**9})))
    variant("ckpt_index", lambda p: (p / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "config.json"}})))
    variant("ckpt_self_link", lambda p: (p / "model.safetensors").unlink() or
            (p / "model.safetensors").symlink_to("model.safetensors"))  # fmt: skip
    return out


def regular_files(folder: Path) -> list[str]:
    """The plain files directly in folder (not links, FIFOs or devices): what must not change."""
    out = []
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            out.append(entry.path)
    return sorted(out)


# --- the cases ------------------------------------------------------------------------------


def fill(args: list[str], files: dict[str, Path]) -> list[str]:
    return [a.replace("{costs}", str(files["costs.csv"])) for a in args]


def generate(n: int, rng: random.Random, files: dict[str, Path], work: Path) -> list[Case]:
    makers = [number_case, file_case, env_case, stream_case, out_case, signal_case,
              checkpoint_case, compare_case]  # fmt: skip
    weights = [30, 20, 12, 8, 10, 8, 7, 5]
    cases = []
    for i in range(n):
        maker = rng.choices(makers, weights)[0]
        case = maker(rng, files, work / f"case{i:04d}")
        if case.out is None:
            case.args += ["--out", str(work / f"case{i:04d}" / "run")]
            case.out = str(work / f"case{i:04d}" / "run")
        cases.append(case)
    return cases


def number_case(rng, files, here) -> Case:
    command = rng.choice(list(NUMBER_OPTIONS))
    option = rng.choice(NUMBER_OPTIONS[command])
    value = rng.choice(NUMBERS)
    if rng.random() < 0.15:  # a valid-looking number of any size
        value = str(rng.choice([0, 1, 2]) * 10 ** rng.randint(0, 30))
    args = fill(BASES[command], files) + [option, value]
    return Case("numbers", args, inputs=[str(files["costs.csv"])])


def file_case(rng, files, here) -> Case:
    command = rng.choice(list(FILE_OPTIONS))
    option = rng.choice(FILE_OPTIONS[command])
    candidates = [k for k in files if not k.startswith("ckpt")]
    name = rng.choice(candidates)
    args = fill(BASES[command], files)
    if option == "--model":
        args = [a for a in args if a not in ("--preset", "tiny")]
    args += [option, str(files[name])]
    return Case("files", args, inputs=regular_files(files["costs.csv"].parent))


def env_case(rng, files, here) -> Case:
    chosen = rng.choice(ENVIRONMENTS)
    # {missing}: a HOME that does not exist, inside the attack's own folder (run as root, a
    # case's matplotlib made /nonexistent/.cache and /nonexistent/.config, and left them)
    missing = str(files["text.txt"].parent / "no-such-home")
    env = {k: v.replace("{file}", str(files["text.txt"])).replace("{missing}", missing)
           for k, v in chosen.items()}  # fmt: skip
    command = rng.choice(["occupancy", "project", "phases", "serve-sweep"])
    args = fill(BASES[command], files) + (["--json"] if rng.random() < 0.3 else [])
    return Case("environment", args, env=env)


def stream_case(rng, files, here) -> Case:
    command = rng.choice(["occupancy", "project", "serve-sweep"])
    args = fill(BASES[command], files) + (["--json"] if rng.random() < 0.5 else [])
    if rng.random() < 0.15:
        args = [command, "--help"]
    stdout, stderr = rng.choice([("closed", "pipe"), ("full", "pipe"), ("pipe", "full"),
                                 ("full", "full"), ("closed", "full")])  # fmt: skip
    return Case("streams", args, stdout=stdout, stderr=stderr)


def out_case(rng, files, here) -> Case:
    here.mkdir(parents=True, exist_ok=True)
    kind = rng.choice(["file", "dev_null", "too_long", "unwritable", "self_link", "user_files",
                       "other_command", "nested_missing"])  # fmt: skip
    args = fill(BASES["occupancy"], files)
    inputs = []
    if kind == "file":
        out = here / "afile"
        out.write_text("mine")
        inputs.append(str(out))
    elif kind == "dev_null":
        out = Path("/dev/null")
    elif kind == "too_long":
        out = here / ("o" * 300)
    elif kind == "unwritable":
        (here / "ro").mkdir()
        (here / "ro").chmod(0o500)
        out = here / "ro" / "run"
    elif kind == "self_link":
        out = here / "self"
        out.symlink_to("self")
    elif kind == "user_files":
        out = here / "mine"
        out.mkdir()
        for name in ("NOTES.md", "data.csv", "plot.png", "keep.json", "trace.csv"):
            text = "output_tokens\n5\n" if name == "trace.csv" else f"user's {name}\n"
            (out / name).write_text(text)
            inputs.append(str(out / name))
        if rng.random() < 0.5:
            args += ["--trace", str(out / "trace.csv")]
        args += ["--force"] if rng.random() < 0.7 else []
    elif kind == "other_command":
        out = here / "proj"
        subprocess.run([sys.executable, "-m", "benchbatch", "project", "--out", str(out)],
                       cwd=ROOT, capture_output=True, timeout=TIMEOUT_S)  # fmt: skip
        inputs += [str(p) for p in out.iterdir()]
        args += ["--force"]
    else:
        out = here / "a" / "b" / "c"
    return Case(f"out:{kind}", args + ["--out", str(out)], out=str(out), inputs=inputs)


def signal_case(rng, files, here) -> Case:
    command = rng.choice(["occupancy", "phases", "serve-sweep"])
    args = fill(BASES[command], files)
    if command == "occupancy":
        args += ["--requests", "3000"]
    return Case("signals", args, signal_after_s=rng.uniform(0.05, 3.0),
                signal_name=rng.choice(["SIGINT", "SIGTERM", "SIGHUP"]))  # fmt: skip


def checkpoint_case(rng, files, here) -> Case:
    names = [k for k in files if k.startswith("ckpt")]
    if not names:
        return number_case(rng, files, here)
    name = rng.choice(names)
    command = rng.choice(["phases", "occupancy"])
    if command == "phases":
        args = [a for a in BASES["phases"] if a not in ("--preset", "tiny")]
    else:
        args = BASES["occupancy"] + ["--engine", "real"]
        if rng.random() < 0.5:
            args += ["--stop-at-eos"]
    inputs = [str(p) for p in files[name].rglob("*") if p.is_file() and not p.is_symlink()]
    return Case("checkpoints", args + ["--model", str(files[name])], inputs=inputs)


def compare_case(rng, files, here) -> Case:
    picks = rng.sample(["a_dir", "missing", "too_long", "text.txt", "loop.csv", "deep_path",
                        "dev_null", "fifo.csv"], k=rng.randint(1, 3))  # fmt: skip
    args = ["compare", *(str(files[p]) for p in picks)]
    if rng.random() < 0.3:
        args += ["--label", rng.choice(["", ",", "a,b,c,d", "x" * 5000, "\x1b[31mred"])]
    return Case("compare", args)


# --- running one case -----------------------------------------------------------------------


def digest(paths: list[str]) -> dict[str, str | None]:
    out = {}
    for p in paths:
        try:
            out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
        except OSError:
            out[p] = None
    return out


def limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    os.setsid()  # its own process group: a signal or a kill reaches its children too


def run_case(case: Case) -> dict:
    try:
        return _run_case(case)
    except Exception as e:  # the harness's own failure: said per case, the attack goes on
        problem = f"harness: {type(e).__name__}: {e}"[:300]
        return {**dataclasses.asdict(case), "code": None, "wall_s": 0.0,
                "problems": [problem], "last_line": ""}  # fmt: skip


def _run_case(case: Case) -> dict:
    before = digest(case.inputs)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **case.env}
    devfull = open("/dev/full", "w")  # noqa: SIM115
    reader, writer = os.pipe()  # "closed": the reader is gone before the program writes
    stdout = {"pipe": subprocess.PIPE, "full": devfull, "closed": writer}[case.stdout]
    stderr = devfull if case.stderr == "full" else subprocess.PIPE
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "benchbatch", *case.args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            preexec_fn=limits)  # fmt: skip
    os.close(writer)
    os.close(reader)
    timer = None
    if case.signal_after_s is not None:
        sig = getattr(signal, case.signal_name)
        timer = threading.Timer(case.signal_after_s, lambda: _send(proc, sig))
        timer.start()
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        hung = True
    finally:
        devfull.close()
        if timer is not None:
            timer.cancel()
    out = (out or b"").decode("utf-8", "replace") if isinstance(out, bytes) else (out or "")
    err = (err or b"").decode("utf-8", "replace") if isinstance(err, bytes) else (err or "")
    return judge(case, proc.returncode, out, err, hung, before, time.monotonic() - t0)


def _send(proc, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def judge(case: Case, code: int, out: str, err: str, hung: bool, before: dict, wall: float):
    problems = []
    if hung:
        problems.append("hang")
    elif code is not None and code < 0:
        problems.append(f"killed by signal {-code}" + (" (memory?)" if -code == 9 else ""))
    elif code not in OK_CODES:
        problems.append(f"exit {code}")
    text = out + err
    if "Traceback (most recent call last)" in text:
        problems.append("traceback")
    if "MemoryError" in text:
        problems.append("memory")
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 2 and case.stderr != "full" and not (lines and lines[-1].startswith("Error: ")):
        problems.append("exit 2 without an 'Error:' line")
    if case.out and _is_dir(case.out) and not hung:
        status = _status(Path(case.out))
        if status == "running":
            problems.append("metadata left running")
    after = digest(list(before))
    changed = [p for p in before if before[p] != after[p]]
    if changed:
        problems.append(f"input changed or lost: {', '.join(Path(p).name for p in changed)}")
    return {**dataclasses.asdict(case), "code": code, "wall_s": round(wall, 2),
            "problems": problems, "last_line": lines[-1][:300] if lines else ""}  # fmt: skip


def _is_dir(path: str) -> bool:
    """os.path.isdir, which says False where pathlib raises (a name too long, a loop)."""
    return os.path.isdir(path)


def _status(folder: Path) -> str | None:
    try:
        return json.loads((folder / "metadata.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


# --- the run --------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1200, help="how many cases (default 1200)")
    ap.add_argument("--seed", type=int, default=29, help="the cases' seed (default 29)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="where cases.jsonl and summary.md go")
    ap.add_argument("--summarize", type=Path, default=None,
                    help="only write the summary of an earlier run's cases.jsonl")  # fmt: skip
    a = ap.parse_args()
    if a.summarize is not None:
        done = [json.loads(line) for line in a.summarize.read_text().splitlines()]
        print(summarize(done, a, float("nan")))
        return 0
    if a.cases < 1 or a.jobs < 1:
        ap.error("--cases and --jobs must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="benchbatch-attack-"))
    out = a.out or work
    out.mkdir(parents=True, exist_ok=True)
    files = make_files(work)
    cases = generate(a.cases, random.Random(a.seed), files, work)
    t0, done = time.monotonic(), []
    with ThreadPoolExecutor(a.jobs) as pool, open(out / "cases.jsonl", "w") as log:
        for i, result in enumerate(pool.map(run_case, cases), 1):
            done.append(result)
            log.write(json.dumps(result) + "\n")
            if result["problems"]:
                print(f"FAIL {result['family']}: {' '.join(result['args'])[:200]} "
                      f"env={result['env']} -> {result['problems']} | {result['last_line']}",
                      flush=True)  # fmt: skip
            if i % 50 == 0:
                rate = i / (time.monotonic() - t0)
                print(f"{i}/{len(cases)} cases, about {(len(cases) - i) / rate:.0f} s left",
                      file=sys.stderr, flush=True)  # fmt: skip
    summary = summarize(done, a, time.monotonic() - t0)
    (out / "summary.md").write_text(summary)
    print(summary)
    for p in work.rglob("*"):  # the unwritable folders, so the work folder can go
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o700)
    return 1 if any(r["problems"] for r in done) else 0


def summarize(done: list[dict], a, seconds: float) -> str:
    by = collections.defaultdict(lambda: collections.Counter())
    for r in done:
        family = r["family"].split(":")[0]
        by[family]["cases"] += 1
        by[family]["failed"] += bool(r["problems"]) and not r["problems"][0].startswith("harness")
        by[family][f"exit {r['code']}"] += 1
    harness = [r for r in done if any(p.startswith("harness:") for p in r["problems"])]
    failed = [r for r in done if r["problems"] and r not in harness]
    kinds = collections.Counter(p.split(":")[0] for r in failed for p in r["problems"])
    lines = [
        f"# Hostile attack: {len(done)} cases, seed {a.seed}",
        "",
        f"`python3 scripts/hostile_attack.py --cases {a.cases} --seed {a.seed} --jobs {a.jobs}`,"
        f" {seconds / 60:.1f} min on {os.cpu_count()} cores; each case a process under a "
        f"{TIMEOUT_S} s limit and {MEMORY_BYTES // 2**30} GiB of address space.",
        "",
        "| family | cases | failed | exit codes |",
        "| --- | --- | --- | --- |",
    ]
    for family, c in sorted(by.items()):
        codes = ", ".join(f"{k[5:]}: {v}" for k, v in sorted(c.items()) if k.startswith("exit"))
        lines.append(f"| {family} | {c['cases']} | {c['failed']} | {codes} |")
    lines += ["", f"Failed: {len(failed)} of the {len(done) - len(harness)} cases that ran."]
    if harness:
        lines.append(f"Not run: {len(harness)} (the harness could not start them: "
                     f"{harness[0]['problems'][0][9:80]}).")  # fmt: skip
    if kinds:
        lines.append("By kind: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()) + ".")
    for r in failed[:40]:
        shown = " ".join(r["args"])[:160].encode("unicode_escape").decode()  # NUL as \\x00
        lines.append(f"- {r['family']}: `{shown}` {r['env'] or ''} "
                     f"stdout={r['stdout']} stderr={r['stderr']}: {'; '.join(r['problems'])}"
                     f" ({r['last_line'][:120]})")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
