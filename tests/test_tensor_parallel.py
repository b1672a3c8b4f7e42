"""Tensor parallelism on the CPU: two ranks over gloo, started as torchrun starts them.

The sharded model computes the whole model's logits (prefill, cached decode, mixed steps;
split and replicated KV heads, tied and padded LM heads, biases, q/k norms, checkpoints
loaded in slices), the engine gives every request the same tokens; the commands under two
ranks write one run folder (rank 0's) with each rank's times and the all-reduce columns, and
the same tokens and counts as one process; bad shapes stop both ranks with one line and
exit code 2; Ctrl-C to torchrun ends every rank and marks the run interrupted. Every launch
is bounded by a timeout (tests/ranks.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from ranks import REPO, environment, free_port, launch

from benchbatch.app.cli import app
from benchbatch.core import accounting
from benchbatch.core.config import preset

pytestmark = pytest.mark.slow
TIMEOUT = 900  # a hang guard, not a measure of the work: a loaded machine is slow
QUICK = ["--repeats", "2", "--min-time", "0", "--warmup", "1"]


def bb(*args: str) -> list[str]:
    return ["-m", "benchbatch", *args]


def run_folder(cwd) -> os.PathLike:
    folders = list((cwd / "results").iterdir())
    assert len(folders) == 1, folders  # rank 0 alone made a folder
    return folders[0]


def test_sharded_model_computes_the_whole_models_logits_and_tokens(tmp_path):
    transformers = pytest.importorskip("transformers")
    assert transformers
    from test_checkpoint import hf_model, save

    folders = [str(save(hf_model(f, seed=i), tmp_path / f)) for i, f in
               enumerate(("llama-bias", "qwen2", "qwen3"))]  # fmt: skip
    ranks = launch([str(REPO / "tests" / "tp_worker.py"), *folders], tmp_path, timeout=TIMEOUT)
    for r in ranks:
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("logits ok") == 4 + 3
        assert "engine ok: tokens equal" in r.stdout


def test_phases_on_two_ranks(tmp_path):
    ranks = launch(bb("phases", "--preset", "tiny", "--prefill", "16", "--decode-batch", "1,4",
                      "--context", "32", *QUICK), tmp_path, timeout=TIMEOUT)  # fmt: skip
    assert [r.returncode for r in ranks] == [0, 0], ranks[1].stderr
    assert "results:" in ranks[0].stdout and ranks[1].stdout == ""  # rank 0 alone prints
    folder = run_folder(tmp_path)
    rows = pd.read_csv(folder / "phases.csv")
    assert (rows["tp"] == 2).all()
    steps = rows[["step_ms_rank0", "step_ms_rank1"]]
    assert (rows["step_ms"] == steps.max(axis=1)).all()  # the slowest rank's
    assert (rows["allreduce_ms"] > 0).all()
    assert rows["allreduce_share"].tolist() == pytest.approx(
        (rows["allreduce_ms"] / rows["step_ms"]).tolist(), rel=1e-5
    )  # CSVs keep 6 significant digits
    cfg = preset("tiny")
    for r in rows.itertuples():  # one rank's FLOPs and bytes
        cost = accounting.step_cost(cfg, "fp32", r.batch, r.tokens, r.context, tp=2)
        assert (r.flops, r.bytes) == (cost.flops, cost.bytes)
        assert r.allreduce_bytes == r.batch * r.tokens * cfg.hidden * 4
    meta = json.loads((folder / "metadata.json").read_text())
    world = meta["distributed"]
    assert (world["world_size"], world["backend"], world["tp"]) == (2, "gloo", 2)
    assert [r["rank"] for r in world["ranks"]] == [0, 1]
    assert all(r["host"] and r["device"] == "cpu" for r in world["ranks"])
    assert meta["status"] == "complete" and meta["options"]["tp"] == 2
    probe = pd.read_csv(folder / "probe.csv")
    links = probe[probe["kind"] == "allreduce"]
    assert len(links) >= 5 and (links["ranks"] == 2).all()
    assert (folder / "allreduce.png").is_file()


def test_sweep_on_two_ranks_holds_a_bigger_batch(tmp_path):
    ranks = launch(bb("sweep", "--preset", "tiny", "--batch", "1,8", "--context", "16",
                      "--no-roofline", *QUICK), tmp_path, timeout=TIMEOUT)  # fmt: skip
    assert [r.returncode for r in ranks] == [0, 0], ranks[0].stderr
    folder = run_folder(tmp_path)
    rows = pd.read_csv(folder / "sweep.csv")
    assert {"allreduce_ms_rank0", "allreduce_ms_rank1", "allreduce_share"} <= set(rows.columns)
    cfg = preset("tiny")
    assert rows["kv_cache_bytes"].tolist() == [
        accounting.kv_cache_bytes(cfg, "fp32", b, 17, tp=2) for b in rows["batch"]
    ]
    meta = json.loads((folder / "metadata.json").read_text())
    free = meta["free_memory_bytes_before_model"]
    limit = meta["predicted_max_batch"]["16"]
    assert limit == accounting.max_batch(cfg, "fp32", 17, free, tp=2)
    assert limit > accounting.max_batch(cfg, "fp32", 17, free)


def test_cpu_ranks_on_one_machine_share_its_ram(monkeypatch):
    """Each CPU rank's free memory is its share of the machine's available RAM (two ranks
    had each counted all 22 GiB, and their ceilings doubled); a GPU's is its own."""
    import torch

    from benchbatch.runtime import backend, device

    monkeypatch.setattr(backend.of(torch.device("cpu")).__class__, "free_memory",
                        lambda self: 22 * 2**30)  # fmt: skip
    cpu = torch.device("cpu")
    assert device.free_memory_bytes(cpu) == 22 * 2**30  # one process
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 4 ranks, 2 on this machine
    assert device.free_memory_bytes(cpu) == 11 * 2**30
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # unset: every rank here
    assert device.free_memory_bytes(cpu) == 22 * 2**30 // 4


def test_real_engine_on_two_ranks_gives_the_tokens_of_one(tmp_path, runner):
    args = ["occupancy", "--engine", "real", "--preset", "tiny", "--requests", "10",
            "--slots", "4", "--median", "6", "--max-output", "16", "--prompt-len", "6"]  # fmt: skip
    ranks = launch(bb(*args), tmp_path, timeout=TIMEOUT)
    assert [r.returncode for r in ranks] == [0, 0], ranks[0].stderr
    folder = run_folder(tmp_path)
    two = pd.read_csv(folder / "engine.csv")
    steps = pd.read_csv(folder / "engine_steps.csv")
    assert (steps["step_ms"] == steps[["step_ms_rank0", "step_ms_rank1"]].max(axis=1)).all()
    decode = pd.read_csv(folder / "collectives.csv")  # the engine's decode step, per rank
    assert decode["batch"].tolist() == [4] and decode["allreduce_ms_rank1"].iloc[0] > 0
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "one")])
    assert result.exit_code == 0, result.output
    one = pd.read_csv(tmp_path / "one" / "engine.csv")
    assert two["tokens_digest"].tolist() == one["tokens_digest"].tolist()
    assert two["total_steps"].tolist() == one["total_steps"].tolist()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--hidden", "48", "--heads", "3", "--kv-heads", "3"], "3 attention heads do not split"),
        (["--tp", "3"], "--tp: 3 is more than the 2 rank(s)"),
        (["--device", "cuda:1"], "--device: under torchrun every rank uses cuda:LOCAL_RANK"),
    ],
)
def test_bad_combinations_stop_both_ranks_with_one_line(tmp_path, args, message):
    """Rank 0 says the error; a rank started by hand (no torchrun to end it) says its own
    after its grace (0 here), marked with its rank."""
    now = {"BENCHBATCH_RANK_ERROR_GRACE_S": "0"}
    ranks = launch(bb("phases", "--preset", "tiny", "--context", "32", "--prefill", "16", *args),
                   tmp_path, timeout=TIMEOUT, env=now)  # fmt: skip
    for r, start in zip(ranks, ("Error: ", "Error (rank 1): "), strict=True):
        assert r.returncode == 2
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(start) and message in lines[0], lines
    assert not (tmp_path / "results").exists()


def test_a_bad_option_under_torchrun_is_said_once(tmp_path):
    """Under torchrun the ranks' output is one stream: the error once (rank 0's), not once a
    rank, and no "interrupted" line from a rank torchrun ended first."""
    args = ["--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "benchbatch",
            "phases", "--preset", "tiny", "--tp", "3", "--out", str(tmp_path / "run")]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *args], cwd=tmp_path,
                          env=environment(), capture_output=True, text=True,
                          timeout=TIMEOUT)  # fmt: skip
    said = (done.stdout + done.stderr).splitlines()
    errors = [line for line in said if line.startswith("Error")]
    assert done.returncode != 0 and len(errors) == 1, said
    assert errors[0].startswith("Error: --tp: 3 is more than the 2 rank(s) torchrun started")
    assert not any(line.startswith("interrupted") for line in said)
    assert not (tmp_path / "run").exists()


def test_a_lost_rank_is_one_line_naming_where_the_rows_are(monkeypatch, capsys, tmp_path):
    """A collective that failed because another rank left (gloo's RuntimeError): one line,
    the run marked failed with its rows, not a traceback from the surviving rank."""
    from benchbatch.app import cli
    from benchbatch.core import ranks
    from benchbatch.output.run_folder import Run

    lost = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                        "[127.0.0.1]:4242: Connection reset by peer")  # fmt: skip
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert ranks.peer_lost(lost) and not ranks.peer_lost(RuntimeError("a bug"))
    assert not ranks.peer_lost(ValueError("Connection reset by peer, gloo"))
    (tmp_path / "run").mkdir()
    run = Run(tmp_path / "run", "phases", {})
    run.add("phases", {"x": 1})
    assert cli._peer_lost(lost) == 1
    line = capsys.readouterr().err.strip()
    assert line == ("Error: another rank left the run ([../third_party/gloo/gloo/transport/"
                    "tcp/pair.cc:534] Read error [127.0.0.1]:4242: Connection reset by peer): "
                    f"rows measured so far are in {tmp_path / 'run'} (phases.csv 1)")  # fmt: skip
    meta = json.loads((tmp_path / "run" / "metadata.json").read_text())
    assert meta["status"] == "failed" and "Connection reset by peer" in meta["error"]
    from types import SimpleNamespace

    from benchbatch.runtime import distributed

    monkeypatch.setattr(distributed, "current", lambda: SimpleNamespace(distributed=True))
    assert cli._rank_left(lost)
    monkeypatch.setattr(distributed, "current", lambda: SimpleNamespace(distributed=False))
    assert not cli._rank_left(lost)  # the ranks never joined: a rendezvous, not a rank leaving
    monkeypatch.delenv("RANK")
    assert not ranks.peer_lost(lost)  # one process: not another rank's doing


def test_tp_without_torchrun_is_one_line(runner, tmp_path):
    result = runner.invoke(app, ["phases", "--preset", "tiny", "--tp", "2",
                                 "--out", str(tmp_path / "x")])  # fmt: skip
    assert result.exit_code == 2
    assert "Error: --tp: 2 ranks need torchrun" in result.output
    assert not (tmp_path / "x").exists()


def test_probe_measures_the_all_reduce_between_the_ranks(tmp_path):
    ranks = launch(bb("probe", "--sizes", "128", "--buffer-mb", "4", *QUICK), tmp_path,
                   timeout=TIMEOUT)  # fmt: skip
    assert [r.returncode for r in ranks] == [0, 0], ranks[0].stderr
    folder = run_folder(tmp_path)
    rows = pd.read_csv(folder / "probe.csv")
    links = rows[rows["kind"] == "allreduce"]
    assert links["size"].tolist() == sorted(links["size"]) and len(links) == 9
    # nccl-tests' bus bandwidth: algbw x 2(n-1)/n, which is algbw itself on two ranks
    assert links["gbps"].tolist() == pytest.approx(links["algbw_gbps"].tolist(), rel=1e-5)
    assert (folder / "allreduce.png").is_file() and (folder / "roofline.png").is_file()
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["interconnect"]["ranks"] == 2


def _children(pid: int) -> list[int]:
    """Processes whose parent is pid (torchrun's workers: each in its own session)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_under_torchrun_ends_every_rank_and_marks_the_run(tmp_path):
    out = tmp_path / "run"
    # A free port of its own: torchrun's default (29500) may be held by another job.
    args = ["--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "benchbatch",
            "occupancy", "--engine", "real",
            "--preset", "tiny", "--requests", "3000", "--slots", "4", "--max-output", "100",
            "--prompt-len", "16", "--out", str(out)]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", *args]
    proc = subprocess.Popen(
        torchrun, cwd=tmp_path, env=environment(), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (out / "engine_steps.csv").is_file():  # the engine is running
            if proc.poll() is not None or time.monotonic() > deadline:
                said = proc.communicate(timeout=TIMEOUT)[0][-3000:]
                pytest.fail(f"the run never started: {said}")
            time.sleep(0.2)
        workers = _children(proc.pid)
        assert len(workers) == 2
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in torchrun's terminal
        proc.communicate(timeout=TIMEOUT)
        assert proc.returncode != 0
        deadline = time.monotonic() + TIMEOUT  # a hang guard: loaded, workers end slowly
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers)
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["status"] == "interrupted"
        assert len(pd.read_csv(out / "engine_steps.csv")) > 0
    finally:
        for pid in [proc.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_all_reduces_timed_longer_than_their_step_are_flagged_and_warned():
    """On a CPU whose ranks share cores, the all-reduces timed on their own took 160-239%
    of the whole step holding them, printed as such with no word: the row says so
    (allreduce_over_step) and the run warns once, naming the steps."""
    import types

    from benchbatch.experiments import common as c
    from benchbatch.runtime import steps

    world = types.SimpleNamespace(tp=2)
    ranks = [{"allreduce_ms": ms, "allgather_ms": 0.1, "stats": {"step_ms": 6.0}}
             for ms in (9.7, 9.1)]  # fmt: skip
    cfg = preset("tiny")
    over = steps.collective_columns(cfg, "fp32", steps.decode(4, 32), world, ranks, 6.08)
    assert over["allreduce_over_step"] is True and over["allreduce_share"] == 9.7 / 6.08
    fine = steps.collective_columns(cfg, "fp32", steps.decode(1, 32), world, ranks, 12.0)
    assert fine["allreduce_over_step"] is False

    class Rec:
        warnings: list = []

        def warning(self, line):
            self.warnings.append(line)

    rec = Rec()
    rows = [over | {"label": "decode b=4"}, fine | {"label": "decode b=1"}]
    c.say_allreduce_over_step(rec, rows, lambda r: r["label"])
    assert len(rec.warnings) == 1
    assert "at 1 of 2 steps (decode b=4; up to 160% of decode b=4)" in rec.warnings[0]
    rec.warnings = []
    c.say_allreduce_over_step(rec, rows[1:], lambda r: r["label"])
    assert rec.warnings == []
