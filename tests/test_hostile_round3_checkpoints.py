"""Issue 29, items 2, 10 and 17: a checkpoint's problems are refused in one line naming
--model (exit 2) before the run folder exists: missing, extra, misshapen or wrong-dtype
tensors, a tied head unequal to the embedding, no safetensors, a bad eos_token_id or
generation_config.json (and an eos id outside the vocabulary with --stop-at-eos), corrupt or
truncated safetensors files and an index naming a file that is none. Values past fp16's
range are only seen when the weights are read: one line naming --model, and the folder is
marked failed."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchbatch.app.cli import app
from benchbatch.errors import UserError

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, vocab_size=64, max_position_embeddings=64, rms_norm_eps=1e-6,
)  # fmt: skip
FAST = ["--device", "cpu", "--repeats", "1", "--min-time", "0", "--no-roofline"]
PHASES = ["phases", *FAST, "--prefill", "4", "--context", "4", "--decode-batch", "1"]
EOS = ["occupancy", "--engine", "real", "--stop-at-eos", "--device", "cpu", "--requests", "2",
       "--slots", "1", "--prompt-len", "4", "--max-output", "4"]  # fmt: skip


def _saved(path: Path, tied: bool) -> Path:
    config = transformers.LlamaConfig(**TINY, tie_word_embeddings=tied)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {tied: _saved(root / f"tied{tied}", tied) for tied in (False, True)}


@pytest.fixture
def model(originals, tmp_path):
    """A fresh copy of the untied checkpoint (tied=True: the tied one) to break."""

    def copy(tied: bool = False) -> Path:
        dest = tmp_path / f"m{tied}"
        shutil.copytree(originals[tied], dest)
        return dest

    return copy


def rewrite(folder: Path, change) -> None:
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    change(tensors)
    safetensors_torch.save_file(tensors, path)


def refused_before_folder(runner, tmp_path, args, option="--model") -> str:
    out = tmp_path / "out"
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {option}: "), result.stderr
    assert "Traceback" not in result.output
    assert not out.exists(), "the run folder was made before the error"
    return lines[0]


def _set_header(folder: Path, blob: bytes) -> None:
    (folder / "model.safetensors").write_bytes(blob)


def _header(folder: Path) -> tuple[dict, bytes]:
    data = (folder / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _with_header(folder: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    _set_header(folder, struct.pack("<Q", len(raw)) + raw + body)


# --- item 2: what the headers and config.json tell, before the folder -----------------------

K = "model.layers.0.self_attn.k_proj.weight"
BREAKS = {
    "missing": (lambda t: t.pop("model.layers.0.mlp.down_proj.weight"), "lacks"),
    "extra": (lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}), "holds"),
    "shape": (lambda t: t.update({K: torch.zeros(8, 32)}), "has shape [8, 32]"),
    "dtype": (
        lambda t: t.update({"model.norm.weight": torch.zeros(32, dtype=torch.int8)}),
        "stored as I8",
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(BREAKS))
def test_tensor_problems_are_refused_before_the_folder(runner, tmp_path, model, name):
    folder = model()
    change, says = BREAKS[name]
    rewrite(folder, change)
    assert says in refused_before_folder(runner, tmp_path, [*PHASES, "--model", str(folder)])


def test_a_tied_head_unequal_to_the_embedding_is_refused_first(runner, tmp_path, model):
    folder = model(tied=True)
    rewrite(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    line = refused_before_folder(runner, tmp_path, [*PHASES, "--model", str(folder)])
    assert "lm_head.weight differs from model.embed_tokens.weight" in line


def test_a_tied_head_equal_to_the_embedding_loads(runner, tmp_path, model):
    folder = model(tied=True)
    rewrite(folder, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    result = runner.invoke(app, [*PHASES, "--model", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output


def test_no_safetensors_is_refused_before_the_folder(runner, tmp_path, model):
    folder = model()
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    line = refused_before_folder(runner, tmp_path, [*PHASES, "--model", str(folder)])
    assert "safetensors only" in line


@pytest.mark.parametrize(
    ("generation", "option", "says"),
    [
        ("{not json", "--model", "generation_config.json"),
        ('{"eos_token_id": "x"}', "--model", "not token ids"),
        ('{"eos_token_id": [1, -3]}', "--model", "not token ids"),
        ('{"eos_token_id": 64}', "--stop-at-eos", "64"),  # the vocabulary is 0..63
        ('{"eos_token_id": [2, 100000]}', "--stop-at-eos", "100,000"),
    ],
)
def test_bad_eos_is_refused_before_the_folder(runner, tmp_path, model, generation, option, says):
    folder = model()
    (folder / "generation_config.json").write_text(generation)
    line = refused_before_folder(runner, tmp_path, [*EOS, "--model", str(folder)], option)
    assert says in line


def test_eos_outside_the_vocabulary_names_the_id_and_the_vocabulary(runner, tmp_path, model):
    folder = model()
    (folder / "generation_config.json").write_text('{"eos_token_id": 64}')
    line = refused_before_folder(runner, tmp_path, [*EOS, "--model", str(folder)], "--stop-at-eos")
    assert "eos_token_id 64" in line and "64 tokens" in line


def test_eos_in_config_json_outside_the_vocabulary(runner, tmp_path, model):
    folder = model()
    (folder / "generation_config.json").unlink(missing_ok=True)  # config.json's id, then
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "eos_token_id": 1000}))
    line = refused_before_folder(runner, tmp_path, [*EOS, "--model", str(folder)], "--stop-at-eos")
    assert "eos_token_id 1,000" in line and "config.json" in line


def test_eos_inside_the_vocabulary_runs(runner, tmp_path, model):
    folder = model()
    (folder / "generation_config.json").write_text('{"eos_token_id": [63, 2]}')
    result = runner.invoke(app, [*EOS, "--model", str(folder), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output


def test_values_past_fp16_fail_the_run_in_one_line(runner, tmp_path, model):
    """Only reading the weights shows them: the folder exists, and is marked failed."""
    folder = model()
    rewrite(folder, lambda t: t["model.norm.weight"].fill_(1e6))
    out = tmp_path / "out"
    args = [*PHASES, "--model", str(folder), "--dtype", "fp16", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and errors[0].startswith("Error: --model: "), result.stderr
    assert "model.norm.weight holds values beyond fp16's range" in errors[0]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed"


# --- item 10: corrupt and truncated safetensors --------------------------------------------


def _truncated(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    _set_header(folder, data[:-100])


def _bad_offsets(folder: Path) -> None:
    header, body = _header(folder)
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"] = [0, len(body) * 2]
    _with_header(folder, header, body)


def _unknown_dtype(folder: Path) -> None:
    header, body = _header(folder)
    header["model.norm.weight"]["dtype"] = "Q7"
    _with_header(folder, header, body)


def _index_to(target_name: str, content: bytes | None):
    def change(folder: Path) -> None:
        header, _ = _header(folder)
        names = [k for k in header if k != "__metadata__"]
        (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
        if content is not None:
            (folder / target_name).write_bytes(content)
        weight_map = {n: "model-00001-of-00001.safetensors" for n in names}
        weight_map[names[0]] = target_name
        index = {"metadata": {}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    return change


CORRUPT = {
    "header length past the file": lambda d: _set_header(
        d, struct.pack("<Q", 2**60) + (d / "model.safetensors").read_bytes()[8:]
    ),
    "header length of 2**64-1": lambda d: _set_header(d, b"\xff" * 8 + b"{}"),
    "bad JSON in the header": lambda d: _set_header(d, struct.pack("<Q", 5) + b"{abc}"),
    "a header that is a list": lambda d: _set_header(d, struct.pack("<Q", 2) + b"[]"),
    "an empty file": lambda d: _set_header(d, b""),
    "four bytes": lambda d: _set_header(d, b"\x01\x02\x03\x04"),
    "truncated data": _truncated,
    "offsets past the data": _bad_offsets,
    "an unknown dtype": _unknown_dtype,
    "an index naming a .bin shard": _index_to("pytorch_model.bin", b"PK\x03\x04 not safetensors"),
    "an index naming a text file": _index_to("notes.txt", b"hello"),
    "an index naming an empty file": _index_to("empty.safetensors", b""),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_safetensors_are_one_line_before_the_folder(runner, tmp_path, model, name):
    folder = model()
    CORRUPT[name](folder)
    line = refused_before_folder(runner, tmp_path, [*PHASES, "--model", str(folder)])
    assert str(folder) in line or "safetensors" in line, line


def test_corrupt_files_are_user_errors_from_the_loader_too(tmp_path, model):
    from benchbatch.runtime import checkpoint

    folder = model()
    CORRUPT["bad JSON in the header"](folder)
    with pytest.raises(UserError) as err:
        checkpoint.load(folder, "cpu", torch.float32)
    assert err.value.option == "--model" and "\n" not in str(err.value)


# A few seconds; HOSTILE_EXAMPLES=2000 for a longer hunt (as tests/test_hostile_properties.py).
QUICK = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", 40)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@QUICK
@given(
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4),
    length=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)
def test_any_mangled_header_loads_or_is_one_line(originals, tmp_path_factory, cut, flips, length):
    """Bytes of the header's first few hundred changed, its length rewritten or the file
    cut short: the checks before the folder either pass (and then the weights load) or
    refuse in one line naming --model; nothing else is raised."""
    from benchbatch.runtime import checkpoint

    folder = tmp_path_factory.mktemp("mangled") / "m"
    shutil.copytree(originals[False], folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    if length is not None:
        data[:8] = struct.pack("<Q", length)
    for at, byte in flips:
        data[8 + at] = byte
    if cut:
        data = data[: len(data) - cut]
    (folder / "model.safetensors").write_bytes(bytes(data))
    cfg = checkpoint.read_config(folder)
    try:
        checkpoint.check(folder, "cpu", torch.float32, cfg)
    except UserError as e:
        assert e.option == "--model" and "\n" not in str(e)
        return
    try:
        checkpoint.load(folder, "cpu", torch.float32)
    except UserError as e:  # values read from a mangled body: still one line
        assert e.option == "--model" and "\n" not in str(e)


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=5)
)


@QUICK
@given(
    value=st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=4)),
    vocab=st.integers(1, 200),
)
def test_any_eos_id_is_a_token_of_the_vocabulary_or_one_line(tmp_path_factory, value, vocab):
    """Whatever generation_config.json's eos_token_id holds: ids the model can generate, or
    one line naming --model (not ids) or --stop-at-eos (none, or outside the vocabulary)."""
    from benchbatch.core.checkpoint_config import eos_token_ids

    folder = tmp_path_factory.mktemp("eos")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": value}))
    try:
        ids = eos_token_ids(folder, vocab)
    except UserError as e:
        assert e.option in ("--model", "--stop-at-eos") and "\n" not in str(e)
        return
    assert ids and all(isinstance(i, int) and 0 <= i < vocab for i in ids)
