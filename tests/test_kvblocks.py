"""KV memory in blocks: the block manager, the scheduler's budget and preemption, against a
brute-force reference written independently of the scheduler (vLLM v1's rules, plainly)."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core import memory
from benchbatch.core.kvblocks import PAGED, RESERVE, BlockManager, KVBudget
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.simulate import run_policies
from benchbatch.core.workload import Request, lognormal_columns
from benchbatch.errors import UserError


def drive(sched, requests, check_blocks=True):
    """Run to completion; every step, every block is free or owned once, within the budget."""
    sched.add_requests(requests)
    plans = []
    while not sched.done:
        assert len(plans) < 100_000, "no progress"
        plan = sched.schedule()
        if check_blocks:
            sched.kv.check()
            assert sched.kv.num_used == plan.kv_blocks <= sched.kv.num_blocks
        sched.update(plan)
        plans.append(plan)
    return plans


def reference(requests, blocks: int, block_size: int, reserve: int | None = None):
    """Continuous batching on a block budget, every step from scratch: the running list in
    admission order; each running request needs blocks for the token it writes this step,
    taking them oldest first; when none is free the newest running request goes back to
    the front of the queue (its blocks freed, its tokens kept), and if that was the request
    itself, the step's growth stops; no admission in a step that preempted; admission (first
    come, first served) takes blocks for the prompt and the tokens to recompute, or, with
    `reserve`, for the prompt and `reserve` output tokens. Every running request yields one
    token a step. Returns steps, each request's token steps, preemptions, blocks per step."""
    need = lambda tokens: math.ceil(tokens / block_size)  # noqa: E731
    waiting = deque(sorted(requests, key=lambda r: r.arrival_step))
    running: list[list] = []  # [request, blocks held]
    generated = {r.id: 0 for r in requests}
    tokens_at = {r.id: [] for r in requests}
    free, step, preemptions, held = blocks, 0, 0, []
    while waiting or running:
        preempted, i = False, 0
        while i < len(running):
            request, have = running[i]
            want = need(request.prompt_tokens + generated[request.id]) - have
            stop = False
            while want > free:
                victim = running.pop()
                free += victim[1]
                waiting.appendleft(victim[0])
                preempted, preemptions = True, preemptions + 1
                if victim[0] is request:
                    stop = True
                    break
            if stop:
                break
            running[i][1] += max(want, 0)
            free -= max(want, 0)
            i += 1
        while not preempted and waiting and waiting[0].arrival_step <= step:
            r = waiting[0]
            take = r.prompt_tokens + (reserve if reserve else generated[r.id])
            if need(take) > free:
                break
            waiting.popleft()
            free -= need(take)
            running.append([r, need(take)])
        held.append(blocks - free)
        for entry in running:
            generated[entry[0].id] += 1
            tokens_at[entry[0].id].append(step)
        for entry in [e for e in running if generated[e[0].id] == e[0].output_tokens]:
            running.remove(entry)
            free += entry[1]
        step += 1
    return step, tokens_at, preemptions, held


def random_requests(rng: random.Random, n: int, arrivals: bool) -> list[Request]:
    return [
        Request(i, rng.randint(1, 20), rng.randint(1, 30), rng.randint(0, 15) if arrivals else 0)
        for i in range(n)
    ]


def fitting_budget(requests, block_size: int, extra: int, policy=PAGED, reserve=None) -> int:
    budget = KVBudget(1, block_size, policy, reserve)
    peak = max(
        math.ceil(budget.peak_tokens(r.prompt_tokens, r.output_tokens) / block_size)
        for r in requests
    )
    return peak + extra


# --- the block manager -------------------------------------------------------------------------


def test_blocks_are_taken_whole_in_order_and_returned():
    bm = BlockManager(5, 4)
    assert bm.grow(0, 9) == [(0, 0), (1, 1), (2, 2)]  # 9 tokens: 3 blocks of 4
    assert bm.grow(0, 12) == [] and bm.holds(0) == 12  # still 3
    assert bm.grow(1, 12) is None and bm.num_free == 2  # all or nothing
    assert bm.grow(1, 8) == [(0, 3), (1, 4)]
    assert bm.free(0) == 3 and bm.num_free == 3
    assert bm.grow(2, 1) == [(0, 0)]  # first in, first out
    bm.check()


# --- the scheduler on a block budget -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 14),
    block_size=st.integers(1, 8),
    extra=st.integers(0, 40),
    arrivals=st.booleans(),
)
def test_paged_scheduler_equals_the_reference_preemptions_included(
    seed, n, block_size, extra, arrivals
):
    rng = random.Random(seed)
    requests = random_requests(rng, n, arrivals)
    blocks = fitting_budget(requests, block_size, extra)
    sched = make_scheduler("continuous", n, kv=KVBudget(blocks, block_size, PAGED))
    plans = drive(sched, requests)
    steps, tokens_at, preemptions, held = reference(requests, blocks, block_size)
    assert len(plans) == steps
    assert sched.recorder.token_steps == tokens_at
    assert sched.preemptions == preemptions == sum(len(p.preempted) for p in plans)
    assert [p.kv_blocks for p in plans] == held
    assert sched.kv.num_used == 0  # every block came back


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 14), block_size=st.integers(1, 8),
       extra=st.integers(0, 60), arrivals=st.booleans())  # fmt: skip
def test_reserving_scheduler_equals_the_reference_and_never_preempts(
    seed, n, block_size, extra, arrivals
):
    rng = random.Random(seed)
    requests = random_requests(rng, n, arrivals)
    reserve = 30
    blocks = fitting_budget(requests, block_size, extra, RESERVE, reserve)
    sched = make_scheduler("continuous", n, kv=KVBudget(blocks, block_size, RESERVE, reserve))
    plans = drive(sched, requests)
    steps, tokens_at, preemptions, held = reference(requests, blocks, block_size, reserve)
    assert (len(plans), sched.recorder.token_steps, [p.kv_blocks for p in plans]) == (
        steps,
        tokens_at,
        held,
    )
    assert preemptions == sched.preemptions == 0 and sched.kv.num_used == 0


def test_a_preempted_request_is_prefilled_again_with_its_tokens_and_resumes():
    # Two requests of prompt 4, blocks of 4, 3 blocks: both fit at admission (2 blocks);
    # at step 1 request 0 needs a second block (token 5), then request 1 does at step 1 too.
    requests = [Request(0, 4, 6), Request(1, 4, 6)]
    sched = make_scheduler("continuous", 2, kv=KVBudget(3, 4, PAGED))
    plans = drive(sched, requests)
    assert plans[1].preempted == (1,)  # the newest gave its block to the oldest
    back = next(p for p in plans if 1 in p.admitted and p.step > 0)
    chunk = next(c for c in back.prefills if c.request_id == 1)
    # It had generated 1 token: its prompt and that token are prefilled again.
    assert (chunk.start, chunk.num_tokens, chunk.completes_prompt) == (0, 5, True)
    assert len(sched.recorder.token_steps[1]) == 6  # and still yields 6 tokens in all
    assert sched.finished == [0, 1]


def test_static_reserve_holds_the_group_memory_until_the_group_ends():
    requests = [Request(0, 4, 1), Request(1, 4, 5), Request(2, 4, 1)]
    sched = make_scheduler("static", 3, kv=KVBudget(6, 4, RESERVE, 5))  # 3 blocks each: 2 fit
    plans = drive(sched, requests)
    assert [p.admitted for p in plans][:1] == [(0, 1)]
    assert [p.kv_blocks for p in plans] == [6, 6, 6, 6, 6, 3]  # the padded slot keeps its 3
    assert plans[-1].admitted == (2,)


def test_on_the_slot_count_worth_reservation_is_the_slot_policies():
    requests = lognormal_columns(300, median=20, sigma=0.9, max_output=200, prompt_len=16,
                                 seed=4)  # fmt: skip
    slots = 8
    setup = memory.MemorySetup(slots * memory.slot_blocks(16, 16, 200), 16, 200)
    mem = memory.run(requests, setup)
    plain = run_policies(requests, slots)
    for policy in ("static", "continuous"):
        reserved = mem[f"{policy}-reserve"]
        assert reserved.total_steps == plain[policy].total_steps
        assert reserved.timeline.active_slots == plain[policy].timeline.active_slots
    paged = mem["continuous-paged"]
    assert max(paged.timeline.active_slots) > slots  # the same memory runs more at once
    assert paged.total_steps < plain["continuous"].total_steps


def test_memory_rows_fragmentation_and_preemptions():
    requests = lognormal_columns(200, median=30, sigma=0.9, max_output=300, prompt_len=16,
                                 seed=1)  # fmt: skip
    setup = memory.MemorySetup(160, 16, 300, bytes_per_token=1024, source="test", slots=8)
    rows = {r["policy"]: r for r in memory.rows(memory.run(requests, setup), setup, 200 * 16)}
    paged, reserve = rows["continuous-paged"], rows["continuous-reserve"]
    assert paged["peak_running"] > reserve["peak_running"]
    assert paged["mean_running"] > reserve["mean_running"]
    assert reserve["fragmentation"] > 0.5 > paged["fragmentation"]
    assert reserve["preemptions"] == 0 < paged["preemptions"]
    assert paged["recomputed_tokens"] > 0 == reserve["recomputed_tokens"]
    for r in rows.values():
        assert r["kv_reserved_peak_tokens"] <= 160 * 16
        assert r["kv_used_mean_tokens"] <= r["kv_reserved_mean_tokens"]
        assert r["kv_budget_gib"] == 160 * 16 * 1024 / 2**30


# --- what the scheduler refuses ------------------------------------------------------------------


def test_a_request_larger_than_the_budget_is_a_user_error():
    sched = make_scheduler("continuous", 4, kv=KVBudget(3, 4, PAGED))
    with pytest.raises(UserError) as e:
        sched.add_requests([Request(0, 10, 4)])  # 13 tokens: 4 blocks of 4
    assert e.value.option == "kv_memory" and "needs 4 blocks" in e.value.message


def test_kv_blocks_are_modelled_with_mixed_steps_only():
    kv = KVBudget(100, 16)
    with pytest.raises(UserError, match="mixed steps"):
        make_scheduler("continuous", 4, kv=kv, chunked_prefill=True, mixed=False)
    with pytest.raises(UserError, match="token budget only") as e:
        make_scheduler("continuous", 4, kv=kv, chunked_prefill=True, max_num_batched_tokens=64,
                       chunk_size=16)  # fmt: skip
    assert e.value.option == "chunk_size"
    with pytest.raises(ValueError, match="reserve"):
        make_scheduler("static", 4, kv=kv)
    with pytest.raises(ValueError):
        KVBudget(0, 16)


def test_unchunked_with_kv_the_longest_recompute_must_fit_the_budget():
    # A preempted request prefills its prompt and generated tokens again, whole: one that
    # could outgrow the budget would wait for ever (vLLM asks the budget to cover it too).
    sched = make_scheduler("continuous", 2, kv=KVBudget(100, 4), max_num_batched_tokens=20)
    sched.add_requests([Request(0, 15, 6)])  # 15 + 5 = 20 fits
    with pytest.raises(UserError) as e:
        sched.add_requests([Request(1, 15, 7)])  # 15 + 6 = 21
    assert e.value.option == "max_num_batched_tokens" and "21-token prompt and recompute" in str(
        e.value.message
    )


# --- under a token budget and chunked prefill: vLLM v1's scheduler, as its source reads ----------


def reference_v1(requests, blocks, block_size, budget, seqs, chunked, chunk=None):
    """vLLM v1's Scheduler.schedule() (vllm/v1/core/sched/scheduler.py), plainly, with
    nothing of benchbatch's: every request is num_computed_tokens against num_tokens
    (prompt + output so far); the running list in scheduling order gets min(num_tokens -
    num_computed, chunk, budget left) tokens each while the budget lasts, each allocating
    blocks for num_computed + new tokens and, while the pool lacks them, popping the last
    running request (freed, num_computed 0, to the front of the queue) until it gets them
    or is itself the one popped; then, if nothing was preempted, waiting requests in order
    while len(running) < max_num_seqs and budget remains (unchunked: the whole remaining
    prompt must fit it), each taking blocks for its new tokens or stopping the queue. A
    request whose num_computed reaches num_tokens samples a token; it finishes at its
    output length. Returns steps, each request's token steps, preemptions, blocks held.
    chunk: vLLM's long_prefill_token_threshold (None: off, its default)."""
    need = lambda tokens: math.ceil(tokens / block_size)  # noqa: E731
    waiting = deque(sorted(requests, key=lambda r: r.arrival_step))
    running: list = []
    computed = {r.id: 0 for r in requests}
    generated = {r.id: 0 for r in requests}
    held_by = {r.id: 0 for r in requests}
    tokens_at = {r.id: [] for r in requests}
    num_tokens = lambda r: r.prompt_tokens + generated[r.id]  # noqa: E731
    free, step, preemptions, held = blocks, 0, 0, []

    def allocate(r, new) -> bool:
        nonlocal free
        want = max(0, need(computed[r.id] + new) - held_by[r.id])
        if want > free:
            return False
        free, held_by[r.id] = free - want, held_by[r.id] + want
        return True

    while waiting or running:
        left, scheduled, preempted = budget, {}, False
        i = 0
        while i < len(running) and left > 0:
            r = running[i]
            new = min(num_tokens(r) - computed[r.id], chunk or budget, left)
            while not allocate(r, new):
                victim = running.pop()
                free, held_by[victim.id], computed[victim.id] = free + held_by[victim.id], 0, 0
                waiting.appendleft(victim)
                preempted, preemptions = True, preemptions + 1
                if victim is r:
                    break
            if r not in running:
                break
            scheduled[r.id], left, i = new, left - new, i + 1
        while not preempted and waiting and waiting[0].arrival_step <= step and left > 0:
            if len(running) == seqs:
                break
            r = waiting[0]
            new = num_tokens(r)
            if not chunked and new > left:
                break
            new = min(new, chunk or budget, left)
            if not allocate(r, new):
                break
            running.append(waiting.popleft())
            scheduled[r.id], left = new, left - new
        held.append(blocks - free)
        for r in list(running):
            if r.id not in scheduled:
                continue
            computed[r.id] += scheduled[r.id]
            if computed[r.id] == num_tokens(r):
                generated[r.id] += 1
                tokens_at[r.id].append(step)
                if generated[r.id] == r.output_tokens:
                    running.remove(r)
                    free, held_by[r.id] = free + held_by[r.id], 0
        step += 1
    return step, tokens_at, preemptions, held


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    n=st.integers(1, 14),
    block_size=st.integers(1, 8),
    extra=st.integers(0, 30),
    seqs=st.integers(1, 6),
    budget_extra=st.integers(0, 30),
    chunk=st.booleans(),
    chunked=st.booleans(),
    arrivals=st.booleans(),
)
def test_paged_scheduler_under_a_token_budget_equals_vllm_v1s_rules(
    seed, n, block_size, extra, seqs, budget_extra, chunk, chunked, arrivals
):
    rng = random.Random(seed)
    requests = random_requests(rng, n, arrivals)
    blocks = fitting_budget(requests, block_size, extra)
    # Unchunked, the budget covers every prompt and recompute (the scheduler requires it).
    least = seqs if chunked else max(r.prompt_tokens + r.output_tokens - 1 for r in requests)
    budget = max(least, seqs) + budget_extra
    # Chunks up to the whole budget (vLLM's default; the scheduler refuses smaller ones
    # with KV blocks), given as the budget itself or not at all.
    chunk = budget if chunked and chunk else None
    sched = make_scheduler("continuous", seqs, kv=KVBudget(blocks, block_size, PAGED),
                           max_num_batched_tokens=budget, chunked_prefill=chunked,
                           chunk_size=chunk)  # fmt: skip
    plans = drive(sched, requests)
    steps, tokens_at, preemptions, held = reference_v1(
        requests, blocks, block_size, budget, seqs, chunked, chunk
    )
    assert sched.recorder.token_steps == tokens_at
    assert len(plans) == steps
    assert sched.preemptions == preemptions == sum(len(p.preempted) for p in plans)
    assert [p.kv_blocks for p in plans] == held
    assert sched.kv.num_used == 0


def test_a_prefill_under_way_is_preempted_and_starts_again():
    # Blocks of 4, 4 of them, budget 4 a step, chunked: request 0 (prompt 4, 6 tokens out)
    # decodes; request 1's 8-token prompt takes two chunk steps. When request 0's decode
    # crosses into its third block (token 9), the pool is empty: the newest running request,
    # request 1 mid-prefill, is preempted and later prefills all 8 tokens again.
    sched = make_scheduler("continuous", 2, kv=KVBudget(4, 4, PAGED), max_num_batched_tokens=4,
                           chunked_prefill=True)  # fmt: skip
    plans = drive(sched, [Request(0, 4, 7), Request(1, 8, 2, arrival_step=1)])
    preempted = [(p.step, p.preempted) for p in plans if p.preempted]
    assert preempted and all(ids == (1,) for _, ids in preempted)
    restarted = [c for p in plans for c in p.prefills if c.request_id == 1 and c.start == 0]
    assert len(restarted) == 1 + sched.preemptions
    assert sched.recorder.token_steps[1][-1] > sched.recorder.token_steps[0][-1]
