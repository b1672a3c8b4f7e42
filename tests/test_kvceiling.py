"""The memory ceiling of a length distribution (pure arithmetic), the datasheet memories, and
the report's verdict on "memory, not compute, limits the batch"."""

from __future__ import annotations

import pytest

from benchbatch.core import accounting, kvceiling, peaks
from benchbatch.core.config import preset
from benchbatch.core.workload import Request
from benchbatch.output import report

CFG = preset("article")  # fp16: 12 layers x 2 x 2048 x 2 B = 96 KiB of KV a token


def test_reserved_and_paged_ceilings_by_hand():
    per_token = accounting.kv_bytes_per_token(CFG, "fp16")
    assert per_token == 96 * 1024
    workspace = accounting.step_workspace_bytes(CFG, "fp16", 1)
    weights = accounting.weight_bytes(CFG, "fp16")
    memory = 16 * 2**30
    room = int(memory * 0.9) - weights
    # Two requests reaching 100 and 300 tokens (7 and 19 blocks of 16: 208 tokens on average);
    # reservation holds 512 tokens each.
    c = kvceiling.ceiling(CFG, "fp16", memory, [100, 300], 512, 16, "test")
    assert c.kv_room_bytes == room
    assert c.paged_mean_tokens == (7 * 16 + 19 * 16) / 2
    assert c.reserved_sequences == room // (512 * per_token + workspace)
    assert c.paged_sequences == int(room // (208 * per_token + workspace))
    assert c.paging_gain == c.paged_sequences / c.reserved_sequences
    assert 2.4 < c.paging_gain < 2.5  # about 512 / 208


def test_under_tensor_parallelism_each_rank_holds_its_shard_and_its_share_of_the_kv():
    """With tp, the memory is one rank's: beside its shard of the weights, each token's KV
    its share of the heads (the ceiling took the whole model's: half the sequences at tp
    2, none for llama3-70b in bf16 on an 80 GiB GPU of 8)."""
    assert accounting.kv_bytes_per_token(CFG, "fp16", 2) == 48 * 1024  # half the heads
    memory = 16 * 2**30
    one, two = (kvceiling.ceiling(CFG, "fp16", memory, [100, 300], 512, 16, "t", tp=tp)
                for tp in (1, 2))  # fmt: skip
    assert two.kv_room_bytes == int(memory * 0.9) - accounting.weight_bytes(CFG, "fp16", 2)
    assert two.kv_room_bytes > one.kv_room_bytes  # a shard leaves more room
    workspace = accounting.step_workspace_bytes(CFG, "fp16", 1, 2)
    assert two.reserved_sequences == two.kv_room_bytes // (512 * 48 * 1024 + workspace)
    assert two.reserved_sequences > 2 * one.reserved_sequences * 0.99
    big = preset("llama3-70b")
    gpu = kvceiling.datasheet_bytes(80)
    assert kvceiling.kv_room(big, "bf16", gpu) == 0  # 131 GiB of weights: no room
    eight = kvceiling.for_workload(big, "bf16", [Request(0, 1000, 1000)], 1000, 16,
                                   [("h100", gpu)], tp=8)[0]  # fmt: skip
    assert eight.kv_room_bytes == int(gpu * 0.9) - accounting.weight_bytes(big, "bf16", 8)
    assert eight.reserved_sequences > 100  # ~17.6 GiB of shard, ~54 GiB of KV room


def test_a_reservation_rounds_up_to_whole_blocks_and_no_room_means_no_sequence():
    odd = kvceiling.ceiling(CFG, "fp16", 16 * 2**30, [17], 17, 16, "x")
    assert odd.paged_mean_tokens == 32 and odd.reserved_sequences == odd.paged_sequences
    tiny = kvceiling.ceiling(CFG, "fp16", 2**20, [100], 512, 16, "1 MiB")
    assert tiny.kv_room_bytes == 0 and tiny.reserved_sequences == tiny.paged_sequences == 0
    assert tiny.paging_gain is None
    with pytest.raises(ValueError):
        kvceiling.ceiling(CFG, "fp16", 2**30, [], 512, 16, "nothing")


def test_for_workload_reserves_the_longest_prompt_and_the_cap():
    requests = [Request(0, 10, 5), Request(1, 40, 30), Request(2, 20, 1)]
    found = kvceiling.for_workload(CFG, "fp16", requests, 100, 8, [("a", 2**34), ("b", 2**35)])
    assert [c.where for c in found] == ["a", "b"]
    assert found[0].reserved_tokens == 40 + 100
    assert found[0].paged_mean_tokens == (16 + 72 + 24) / 3  # 15, 70, 21 in blocks of 8
    assert found[1].reserved_sequences > found[0].reserved_sequences


def test_no_sequence_is_counted_past_the_models_context():
    """A model of 64 positions holds no 140-token reservation nor a 70-token sequence
    (sweep --max-context 256 counted 9,659 sequences reserving 2,064 tokens each)."""
    from dataclasses import replace

    short = replace(CFG, max_context=64)
    requests = [Request(0, 10, 5), Request(1, 40, 30), Request(2, 20, 1)]
    found = kvceiling.for_workload(short, "fp16", requests, 100, 8, [("a", 2**34)])[0]
    assert found.reserved_tokens == 64  # not 40 + 100
    assert found.paged_mean_tokens == (16 + 64 + 24) / 3  # 15, 64 (not 70), 21 in blocks of 8
    assert kvceiling.clipped_lengths(short, requests, 100)
    assert not kvceiling.clipped_lengths(short, requests[:1], 54)  # 10 + 54 = 64 fits
    assert kvceiling.clipped_lengths(short, requests[:1], 55)
    assert not kvceiling.clipped_lengths(CFG, requests, 100)


def test_datasheet_memories():
    assert peaks.lookup("NVIDIA H100 80GB HBM3").memory_gib == 80
    assert peaks.lookup("NVIDIA H200").memory_gib == 141
    assert peaks.lookup("NVIDIA L4").memory_gib == 24
    assert peaks.lookup("Tesla V100-SXM2-16GB").memory_gib is None  # 16 or 32: no guess
    assert kvceiling.datasheet_bytes(80) == 80 * 2**30
    named = [n for n in peaks.names() if n != "v100"]
    assert all(peaks.lookup(n).memory_gib for n in named)


# --- the report's claim ----------------------------------------------------------------------


def ceiling_row(reserved: int, paged: int) -> dict:
    gain = paged / reserved if reserved else None
    return {"where": "this device (free GPU memory)", "memory_bytes": 80 * 2**30,
            "reserved_tokens": 2064, "reserved_sequences": reserved, "paged_mean_tokens": 176.0,
            "paged_sequences": paged, "paging_gain": gain}  # fmt: skip


@pytest.mark.parametrize(
    ("reserved", "paged", "knee", "largest", "verdict"),
    [
        (100, 1000, 256, 256, report.HOLDS),  # memory stops reservation first; paging x10
        (100, 150, 256, 256, report.PARTLY),  # memory first, paging only x1.5
        (5000, 50_000, 8, 128, report.PARTLY),  # compute first (a CPU), paging x10
        (5000, 6000, 8, 128, report.FAILS),
        (100, 1000, None, 128, report.HOLDS),  # no knee up to 128: 100 came first
        (200, 2000, None, 128, report.PARTLY),  # no knee measured, nor the ceiling reached
        (256, 1000, 256, 256, report.PARTLY),  # at the knee is not before it
    ],
)
def test_memory_verdicts(reserved, paged, knee, largest, verdict):
    assert report.memory_verdict(reserved, paged, knee, largest) == verdict


def test_the_memory_claim_and_section_appear_only_with_a_ceiling():
    sweep = {"measured_knee": 256, "batch_to": 256}
    claims = report.claims(None, sweep, None, None, [ceiling_row(200, 2350)])
    memory = claims[-1]
    assert memory.key == "memory" and memory.verdict == report.HOLDS
    assert memory.measured.startswith("200 sequences reserving 2,064 tokens vs 2,350 paged")
    from benchbatch.core.kvceiling import reservation_text

    # a reservation is held in whole blocks: said where that is more than its length
    assert reservation_text({"reserved_tokens": 2064, "block_size": 16}) == "2,064 tokens"
    assert reservation_text({"reserved_tokens": 84, "block_size": 16}) == (
        "84 tokens (96 in blocks of 16)")  # fmt: skip
    assert "compute knee at batch 256" in memory.measured
    assert memory.rule == report.MEMORY_RULE_TEXT
    assert len(report.claims(None, sweep, None)) == 4
    # 371 sequences are past the knee at 256: compute saturates first, paging still x11.7.
    late = report.claims(None, sweep, None, None, [ceiling_row(371, 4350)])[-1]
    assert late.verdict == report.PARTLY


def test_the_report_section_sets_each_memory_beside_its_ceilings():
    memory_rows = [{"policy": "continuous-paged", "peak_running": 600, "mean_running": 55.0,
                    "fragmentation": 0.043, "preemptions": 3, "total_steps": 1105}]  # fmt: skip
    rep = report.build(
        title="t", notices=[], facts=[], phases_rows=[], phases_summary=None,
        sweep_rows=[{"context": 512, "batch": 1, "step_ms": 1.0, "tokens_per_s": 1e3}],
        sweep_claim=None, occupancy_rows=[], occupancy_workload="w",
        files=["memory.png"], memory_ceiling=[ceiling_row(200, 2350)], memory_rows=memory_rows,
    )  # fmt: skip
    section = next(s for s in rep.sections if s.title == report.MEMORY_TITLE)
    assert section.rows[0][3:] == ["200", "176", "2,350", "11.8x"]
    assert section.image == "memory.png" and "peak 600 running" in section.notes[0]
    assert "| memory, not compute, limits the batch" in report.to_markdown(rep)


def test_occupancys_kv_budget_under_tensor_parallelism_is_one_ranks(monkeypatch):
    """occupancy --engine real under torchrun set each rank's free memory against the whole
    model's weights and KV (half the blocks at tp 2; a model that fits only sharded got none,
    refused naming --kv-memory, which was never given): its shard and its share now."""
    import types

    from benchbatch.core.options import WorkloadOptions
    from benchbatch.experiments.occupancy import run
    from benchbatch.runtime import device as devices

    monkeypatch.setattr(devices, "free_memory_bytes", lambda device: 16 * 2**30)
    workload = WorkloadOptions(requests=8, slots=4, median=8, max_output=20, prompt_len=8)
    opts = types.SimpleNamespace(kv_memory=None, block_size=16)
    requests = workload.draw(0)

    def blocks(tp: int) -> tuple[int, int]:
        target = types.SimpleNamespace(dtype_name="fp16", tp=tp, device="cpu")
        setup = run._memory_setup(opts, workload, requests, CFG, target, free=True)
        return setup.blocks, setup.bytes_per_token

    (one, per_one), (two, per_two) = blocks(1), blocks(2)
    assert per_one == 96 * 1024 and per_two == 48 * 1024
    room = int(16 * 2**30 * 0.9) - accounting.weight_bytes(CFG, "fp16", 2)
    assert two == room // (16 * per_two)  # the shard's room in blocks of its own KV
    assert two > 2 * one
