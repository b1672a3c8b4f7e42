"""Weight layouts: the same model in every memory order, and the measured choice."""

import pytest
import torch

from benchbatch.core.config import preset
from benchbatch.runtime import layout
from benchbatch.runtime.layout import LAYOUTS, PACKED, ROWS, PackedLinear, WeightLayout
from benchbatch.runtime.model import Transformer

pytestmark = pytest.mark.usefixtures("one_thread")
PACKS = layout.packable("cpu", torch.float32)  # torch built with oneDNN (CPU wheels are)
needs_packing = pytest.mark.skipif(not PACKS, reason="no oneDNN prepacked linear here")
PADDED = WeightLayout(packed=True, floor=4)  # products of 1-3 rows computed at 4
EVERY = (*LAYOUTS, PACKED, PADDED) if PACKS else LAYOUTS


@pytest.fixture
def strided_only(monkeypatch):
    """The four strided layouts as the only candidates (PACKED is not on every machine)."""
    monkeypatch.setattr(layout, "packable", lambda *a: False)


def cached_decode_logits(model, tokens):
    """Prefill all but the last token, then decode the last one through the cache."""
    cache = model.new_cache(tokens.shape[0], 32)
    slots = slice(0, tokens.shape[0])
    with torch.inference_mode():
        model.step(tokens[:, :-1], cache, slots)
        return model.step(tokens[:, -1:], cache, slots)[:, 0]


@pytest.mark.parametrize("lay", EVERY, ids=lambda lay: lay.name)
@pytest.mark.parametrize("name", ["tiny", "qwen3-tiny"])
def test_every_layout_is_the_same_model(lay, name):
    cfg = preset("tiny") if name == "tiny" else preset("tiny").replace(qk_norm=True, qkv_bias=True)
    ref = Transformer(cfg, seed=3)
    model = Transformer(cfg, seed=3).lay_out(lay)
    assert model.layout == lay
    wqkv = model.blocks[0].attention.wqkv
    assert isinstance(wqkv, PackedLinear) == lay.packed
    weight = wqkv.weight.to_dense() if lay.packed else wqkv.weight
    assert lay.packed or layout.is_columns(weight) == lay.columns
    assert torch.equal(weight, ref.blocks[0].attention.wqkv.weight)  # same values
    tokens = torch.randint(0, cfg.vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want, got = ref(tokens), model(tokens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # cached decode in this layout against the plain forward of the rows layout
    torch.testing.assert_close(cached_decode_logits(model, tokens), want[:, -1], rtol=1e-4,
                               atol=1e-4)  # fmt: skip


def test_random_weights_are_drawn_alike_in_any_layout():
    cfg = preset("tiny")
    model = Transformer(cfg, seed=5).lay_out(WeightLayout(columns=True))
    model.randomize(5)  # drawn into the transposed storage
    ref = Transformer(cfg, seed=5)
    for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_lay_out_back_to_rows_is_contiguous_again():
    model = Transformer(preset("tiny"), seed=1).lay_out(WeightLayout(columns=True))
    model.lay_out(ROWS)
    assert all(p.is_contiguous() for p in model.parameters())
    assert not any(m.split for m in model.modules() if hasattr(m, "split"))


@pytest.mark.parametrize("lay", [WeightLayout(columns=True, split=True), PACKED],
                         ids=lambda lay: lay.name)  # fmt: skip
def test_a_tied_head_keeps_the_embedding(lay):
    if lay.packed and not PACKS:
        pytest.skip("no oneDNN prepacked linear here")
    cfg = preset("tiny").replace(tie_embeddings=True)
    model = Transformer(cfg, seed=1).lay_out(lay)
    assert model.lm_head.weight is model.embed.weight
    assert model.embed.weight.is_contiguous()


@needs_packing
def test_packed_and_back_is_the_model_as_it_was():
    """Out of PACKED every projection is an nn.Linear again with its very values, stored as
    the new layout says; a model that never ran packed gives the same logits."""
    cfg = preset("tiny")
    ref = Transformer(cfg, seed=2)
    model = Transformer(cfg, seed=2).lay_out(PACKED)
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 4 * cfg.layers + 1
    for lay in (ROWS, WeightLayout(columns=True)):
        model.lay_out(lay)
        assert not any(isinstance(m, PackedLinear) for m in model.modules())
        for (name, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(),
                                     strict=True):  # fmt: skip
            assert torch.equal(a, b), name
        assert layout.is_columns(model.blocks[0].mlp.w2.weight) == lay.columns
        model.lay_out(PACKED)


def test_packing_needs_a_cpu_with_onednn(monkeypatch):
    """No PACKED candidate on a GPU, nor where torch has no oneDNN (tried once per device
    type and dtype)."""
    monkeypatch.setattr(layout, "_packable", {})
    assert PACKED not in layout.candidates(torch.device("meta"), torch.float32)
    assert layout.candidates("cpu", torch.float32, packed=False) == LAYOUTS
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    monkeypatch.setattr(layout, "_packable", {})
    assert layout.candidates("cpu", torch.float32) == LAYOUTS


@needs_packing
def test_compiling_a_packed_model_lays_it_out_strided(monkeypatch):
    """torch.compile takes strided weights: compile_model lays a packed model out in the
    fastest strided layout first (dynamo does not trace oneDNN's opaque tensors)."""
    from benchbatch.runtime import compiled

    asked = []
    monkeypatch.setattr(layout, "choose", lambda model, packed=True: asked.append(packed)
                        or WeightLayout(columns=True))  # fmt: skip
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None: fn)
    model = Transformer(preset("tiny"), seed=1).lay_out(PACKED)
    compiled.compile_model(model)
    assert asked == [False] and model.layout == WeightLayout(columns=True)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


@pytest.mark.usefixtures("strided_only")
def test_choose_takes_the_smallest_score_and_keeps_rows_on_a_tie(monkeypatch):
    model = Transformer(preset("tiny"), seed=1)
    scores = {"v": [2.0, 2.5, 2.1, 3.0]}
    monkeypatch.setattr(layout, "_chosen", {})
    monkeypatch.setattr(layout, "layout_scores", lambda *a: scores["v"])
    assert layout.choose(model) == ROWS
    monkeypatch.setattr(layout, "_chosen", {})
    scores["v"] = [2.2, 2.5, 2.0, 3.0]
    assert layout.choose(model) == WeightLayout(columns=True, split=False)
    scores["v"] = [9.0, 9.0, 9.0, 1.0]  # cached: a second model of the shape is not timed
    assert layout.choose(model) == WeightLayout(columns=True, split=False)
    monkeypatch.setattr(layout, "_chosen", {})
    scores["v"] = [2.0, 2.0, 2.0, 2.0]
    assert layout.choose(model) == ROWS


def test_packed_is_chosen_where_it_scores_least_and_never_for_compile(monkeypatch):
    """With oneDNN's prepacked linear a fifth candidate, chosen on its score like the
    others; packed=False (torch.compile's) times and picks among the strided four."""
    model = Transformer(preset("tiny"), seed=1)
    monkeypatch.setattr(layout, "packable", lambda *a: True)
    monkeypatch.setattr(layout, "_chosen", {})
    timed = []

    def scores(cfg, device, dtype, rows, rounds, layouts):
        timed.append(layouts)
        return [2.5, 2.4, 2.3, 2.6, 2.2][: len(layouts)]

    monkeypatch.setattr(layout, "layout_scores", scores)
    floors = []
    monkeypatch.setattr(layout, "row_floor", lambda *a: floors.append(a) or 4)
    assert layout.choose(model) == PADDED  # timed and chosen at its measured floor
    assert layout.choose(model, packed=False) == WeightLayout(columns=True)
    assert timed == [(*LAYOUTS, PADDED), LAYOUTS]
    assert len(floors) == 1  # measured where packed is a candidate only
    assert PADDED.name == "packed (oneDNN), rows padded to 4" and PACKED.name == "packed (oneDNN)"
    with pytest.raises(AssertionError):
        WeightLayout(columns=True, floor=4)  # a floor is the packed layout's only


@pytest.mark.parametrize(("times", "floor"), [
    ([4.45, 4.8, 4.01, 3.59, 3.51, 3.51, 4.28, 4.54], 4),  # cpu-small's, 2-core AMD EPYC
    ([4.5, 4.81, 4.1, 3.69, 3.63, 3.6, 4.57, 4.76], 4),  # 4 within FLOOR_TIE of 6
    ([4.11, 4.5, 3.78, 3.6, 3.41, 3.39, 4.18, 4.4], 5),  # 4 is 6% off the fastest: 5
    ([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], 1),  # one row the fastest: no padding
    ([1.0, 1.2, 0.96, 0.94, 1.4, 1.5, 1.6, 1.7], 1),  # 3 rows 4% faster: not worth padding
    ([1.0, 1.2, 1.3, 1.3, 1.4, 1.5, 1.6, 0.5], 8),
])  # fmt: skip
def test_the_floor_is_the_fewest_rows_near_the_fastest(times, floor):
    assert layout.pick_floor(times) == floor


def test_row_floor_times_each_row_count_in_turn(monkeypatch):
    """row_floor times the packed probe at every row count of FLOOR_ROWS (alternating, as
    the layouts are) and picks among those times."""
    seen = []

    def alternate(fns, device, rounds):
        seen.append((len(fns), rounds))
        return [1.0, 1.1, 0.9, 0.8, 0.8, 0.85, 0.9, 1.0]

    monkeypatch.setattr(layout, "alternate", alternate)
    monkeypatch.setattr(layout, "run_layers", lambda *a: None)
    monkeypatch.setattr(layout, "pack", lambda w: w)
    assert layout.row_floor(preset("tiny"), torch.device("cpu"), torch.float32, 3) == 4
    assert seen == [(len(layout.FLOOR_ROWS), 3)]


@needs_packing
@pytest.mark.parametrize("shape", [(1, 64), (2, 64), (3, 1, 64), (5, 64), (2, 0, 64)])
def test_a_packed_product_under_its_floor_is_the_product(shape):
    """Padded to the floor, a product of fewer rows is F.linear's, its shape kept; the
    kernel is called with the floor's rows (the profiler's record of its input)."""
    from torch.profiler import ProfilerActivity, profile

    w, b, x = torch.randn(48, 64), torch.randn(48), torch.randn(shape)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out = layout.packed_linear(x, layout.pack(w), b, 4)
    assert out.shape == (*shape[:-1], 48)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
    rows = x.numel() // 64
    called = [e.input_shapes[0] for e in prof.events() if e.name == "mkldnn::_linear_pointwise"]
    assert called == [[max(rows, 4), 64] if 0 < rows < 4 else list(shape)]


@needs_packing
def test_a_floor_laid_out_reaches_every_packed_product():
    model = Transformer(preset("tiny"), seed=2).lay_out(PADDED)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert packed and {m.floor for m in packed} == {4}
    model.lay_out(PACKED)  # the same modules, their floor changed
    assert {m.floor for m in model.modules() if isinstance(m, PackedLinear)} == {1}


def test_layout_scores_time_every_layout():
    cfg, cpu = preset("tiny"), torch.device("cpu")
    scores = layout.layout_scores(cfg, cpu, torch.float32, (1, 4), 1)
    assert len(scores) == len(LAYOUTS)
    assert min(scores) >= 2.0 - 1e-9  # each row count's fastest layout scores 1
    every = layout.candidates(cpu, torch.float32)
    assert len(layout.layout_scores(cfg, cpu, torch.float32, (1, 4), 1, every)) == len(every)


def test_a_dense_decode_needs_no_mask_and_gives_the_masked_logits():
    from benchbatch.runtime.model import grouped_attention

    past = torch.tensor([7, 7])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 4, 16, generator=gen)  # 4 heads sharing 2 KV heads
    keys, values = torch.randn(2, 2, 8, 16, generator=gen), torch.randn(2, 2, 8, 16, generator=gen)
    masked = grouped_attention(q, keys, values, past)
    torch.testing.assert_close(grouped_attention(q, keys, values, past, dense=True), masked)
    shorter = grouped_attention(q, keys, values, torch.tensor([7, 3]))  # one sees 4 keys only
    assert not torch.allclose(shorter[1], masked[1]) and torch.allclose(shorter[0], masked[0])


def test_a_dense_step_is_the_masked_step(monkeypatch):
    """step(dense=True) drops the mask and gives the same logits; without kv_len the
    lengths decide, and uneven slots keep their mask."""
    import benchbatch.runtime.model as model_module

    cfg = preset("tiny")
    model = Transformer(cfg, seed=4)
    tokens = torch.randint(0, cfg.vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    seen = []
    real = model_module.grouped_attention
    monkeypatch.setattr(model_module, "grouped_attention",
                        lambda *a, **k: seen.append(k["dense"]) or real(*a, **k))  # fmt: skip
    out = {}
    for dense, kv_len in ((False, 9), (True, 9), (False, None)):
        cache = model.new_cache(2, 16)
        with torch.inference_mode():
            model.step(tokens[:, :8], cache, slice(0, 2))
            seen.clear()
            out[dense, kv_len] = model.step(tokens[:, 8:], cache, slice(0, 2), kv_len, dense=dense)
        assert set(seen) == {dense or kv_len is None}
    torch.testing.assert_close(out[True, 9], out[False, 9])
    torch.testing.assert_close(out[False, None], out[False, 9])
    cache = model.new_cache(2, 16)
    with torch.inference_mode():
        model.step(tokens[:1, :8], cache, slice(0, 1))
        model.step(tokens[1:, :5], cache, slice(1, 2))
        seen.clear()
        model.step(tokens[:, 8:], cache, slice(0, 2))  # lengths 8 and 5: masked
    assert set(seen) == {False}


@pytest.mark.usefixtures("strided_only")
def test_a_burst_in_four_of_a_layouts_timings_does_not_decide_the_choice(monkeypatch):
    """Each layout's time is the median of its ROUNDS timings: the fastest layout, its
    first four timings at each row count three times as long (another process's burst on
    the core), is still chosen; at three rounds the burst decides (the coin flip that gave
    two runs of one command different layouts, docs/simulation.md)."""
    truth = {ROWS: 1.10, WeightLayout(False, True): 1.05, WeightLayout(True, False): 1.0,
             WeightLayout(True, True): 1.08}  # fmt: skip
    fastest = WeightLayout(True, False)

    def timed(fns, device, rounds):  # the layouts in LAYOUTS' order, each `rounds` times
        burst = lambda lay, r: 3.0 if lay == fastest and r < 4 else 1.0  # noqa: E731
        return [sorted(truth[lay] * burst(lay, r) for r in range(rounds))[rounds // 2]
                for lay in LAYOUTS]  # fmt: skip

    monkeypatch.setattr(layout, "alternate", timed)
    monkeypatch.setattr(layout, "probe_layers", lambda *a: {False: [], True: []})
    model = Transformer(preset("tiny"), seed=1)
    monkeypatch.setattr(layout, "_chosen", {})
    assert layout.ROUNDS >= 9 and layout.choose(model) == fastest
    monkeypatch.setattr(layout, "_chosen", {})
    assert layout.choose(model, rounds=3) != fastest


def test_with_layout_runs_a_command_in_the_layout_it_names(tmp_path):
    """scripts/with_layout.py: the command's model in the forced layout (metadata.json's
    weight_layout says so); an unknown layout is one usage line."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root)}  # this checkout's benchbatch
    run = [sys.executable, str(root / "scripts" / "with_layout.py")]
    out = tmp_path / "run"
    done = subprocess.run([*run, "columns-split", "phases", "--preset", "tiny", "--repeats",
                           "1", "--out", str(out)], capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "metadata.json").read_text())["weight_layout"] == "columns, split"
    if PACKS:  # packed without a floor (packed alone: at the floor measured for the model)
        done = subprocess.run([*run, "packed-unpadded", "phases", "--preset", "tiny",
                               "--repeats", "1", "--out", str(tmp_path / "unpadded")],
                              capture_output=True, text=True, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        meta = json.loads((tmp_path / "unpadded" / "metadata.json").read_text())
        assert meta["weight_layout"] == "packed (oneDNN)"
    bad = subprocess.run([*run, "diagonal", "phases"], capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("usage: with_layout.py")
