"""The user's own model through the commands: a transformers-saved tiny Qwen3 checkpoint with
a tokenizer runs through phases, sweep and `occupancy --engine real --prompts --stop-at-eos`;
the lengths that come out are the ones transformers' greedy generation stops at."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from benchbatch.app.cli import app

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<unk>", "<s>", "hello", "world", "the", "cat", "sat", "on", "a", "mat"]
PROMPTS = ["hello world", "the cat sat on a mat", "a cat", "hello the mat", "world"]
CAP = 10  # --max-output: the longest a request may run
FAST = ["--device", "cpu", "--repeats", "1", "--min-time", "0", "--no-roofline"]
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_qwen3(eos: int | None = None):
    config = transformers.Qwen3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=64, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, eos_token_id=eos,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2 if "norm" in name else 0.3)
    return model


def prompt_ids(folder) -> list[list[int]]:
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [e.ids for e in tok.encode_batch(PROMPTS)]


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> list[int]:
    """Transformers' own greedy continuation, without stopping."""
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The checkpoint, its end-of-sequence token chosen among the tokens greedy decoding
    produces (so some requests stop early), and the lengths transformers stops at."""
    folder = tmp_path_factory.mktemp("own") / "tiny-qwen3"
    folder.mkdir()
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    tok.save(str(folder / "tokenizer.json"))
    free = [greedy(tiny_qwen3(), ids, CAP) for ids in prompt_ids(folder)]
    eos = free[0][3]  # the first request stops after 4 tokens
    tiny_qwen3(eos).save_pretrained(folder)
    expected = [c.index(eos) + 1 if eos in c else CAP for c in free]
    (folder.parent / "prompts.jsonl").write_text(
        "\n".join(json.dumps({"prompt": p}) for p in PROMPTS)
    )
    return folder, expected


def test_phases_and_sweep_run_the_checkpoint(runner, tmp_path, checkpoint):
    folder, _ = checkpoint
    args = ["phases", "--model", str(folder), *FAST, "--prefill", "8,16", "--context", "8"]
    result = runner.invoke(app, [*args, "--decode-batch", "1,2", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert meta["config"]["name"] == "tiny-qwen3" and meta["config"]["qk_norm"] is True
    assert meta["options"]["model"] == str(folder)
    assert (pd.read_csv(tmp_path / "p" / "phases.csv")["status"] == "ok").all()
    args = ["sweep", "--model", str(folder), *FAST, "--batch", "1,2", "--context", "8"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert list(pd.read_csv(tmp_path / "s" / "sweep.csv")["batch"]) == [1, 2]


def test_real_prompts_stop_where_transformers_stops(runner, tmp_path, checkpoint):
    folder, expected = checkpoint
    assert min(expected) < CAP  # the test means something: some requests stop early
    args = ["occupancy", "--engine", "real", "--model", str(folder), "--device", "cpu"]
    args += ["--prompts", str(folder.parent / "prompts.jsonl"), "--stop-at-eos"]
    args += ["--requests", "5", "--slots", "2", "--max-output", str(CAP)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    for policy in ("static", "continuous"):
        trace = pd.read_csv(tmp_path / "o" / f"trace_{policy}.csv")
        assert list(trace["output_tokens"]) == expected, policy
        assert list(trace["prompt_tokens"]) == [len(p.split()) + 1 for p in PROMPTS]
    engine = pd.read_csv(tmp_path / "o" / "engine.csv")
    assert list(engine["generated_tokens"]) == [sum(expected)] * 2
    assert (engine["total_steps"] == engine["sim_steps"]).all()  # beside their own simulation
    # The trace replays: the simulator takes the steps the real run took.
    replay = tmp_path / "r"
    sim = ["occupancy", "--trace", str(tmp_path / "o" / "trace_continuous.csv"), "--slots", "2"]
    assert runner.invoke(app, [*sim, "--out", str(replay)]).exit_code == 0
    steps = pd.read_csv(replay / "occupancy.csv").set_index("policy")["total_steps"]
    assert steps["continuous"] == engine.set_index("policy").loc["continuous", "total_steps"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["occupancy", "--prompts", "p.jsonl"], "--prompts"),
        (["occupancy", "--engine", "real", "--stop-at-eos"], "--stop-at-eos"),
        (["phases", "--model", "MODEL", "--preset", "tiny"], "--model"),
        (["phases", "--model", "MODEL", "--hidden", "128"], "--model"),
        (["phases", "--model", "MODEL", "--max-context", "4096"], "--max-context"),
        (["phases", "--model", "Qwen/Qwen3-0.6B"], "--model"),
    ],
)
def test_bad_combinations_are_one_line(runner, tmp_path, checkpoint, args, option):
    args = [str(checkpoint[0]) if a == "MODEL" else a for a in args]
    result = runner.invoke(app, [*args, "--device", "cpu", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {option}:"), lines
    assert not (tmp_path / "x").exists()
