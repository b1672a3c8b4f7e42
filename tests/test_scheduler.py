"""The scheduler's contract, its budgets and its invariants, driven without any model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchbatch.core.plans import PrefillChunk, StepPlan
from benchbatch.core.scheduler import ContinuousScheduler, StaticScheduler, make_scheduler
from benchbatch.core.scheduler_config import SchedulerConfig
from benchbatch.core.workload import Request
from benchbatch.errors import UserError


def reqs(*outputs: int, prompt: int = 8, arrivals: list[int] | None = None) -> list[Request]:
    arrivals = arrivals or [0] * len(outputs)
    return [
        Request(i, prompt, n, a) for i, (n, a) in enumerate(zip(outputs, arrivals, strict=True))
    ]


def drive(sched, requests) -> list[StepPlan]:
    """Run to completion, returning every plan."""
    sched.add_requests(requests)
    plans = []
    while not sched.done:
        assert len(plans) < 10_000, "no progress"
        plan = sched.schedule()
        sched.update(plan)
        plans.append(plan)
    return plans


# --- the article's rule (default settings) -------------------------------------------------


def test_n_tokens_hold_a_slot_for_exactly_n_steps():
    sched = ContinuousScheduler(slots=2)
    plans = drive(sched, reqs(3, 1, 2, prompt=5))
    steps = sched.recorder.token_steps
    assert steps == {0: [0, 1, 2], 1: [0], 2: [1, 2]}  # request 2 takes request 1's slot
    assert len(plans) == 3
    first = plans[0]
    assert first.prefills == (PrefillChunk(0, 0, 0, 5, True), PrefillChunk(1, 1, 0, 5, True))
    assert first.admitted == (0, 1) and first.decodes == ()
    # Step 1: request 0 decodes (prompt 5 + 1 token in cache), request 2 enters slot 1.
    assert [(d.slot, d.request_id, d.context_len) for d in plans[1].decodes] == [(0, 0, 5)]
    assert plans[1].prefills == (PrefillChunk(1, 2, 0, 5, True),)
    assert plans[2].decodes[0].context_len == 6
    assert sched.finished == [1, 0, 2]


def test_each_plan_counts_the_steps_since_its_requests_changed():
    """since_change: 0 where a step's requests are not the last step's (one joined or
    left), else one more than the last step's; an idle step between is a change too."""
    sched = ContinuousScheduler(slots=2)
    # 0 alone for 2 steps, 1 joins at step 2 (0 goes on), 0 ends at step 4, 1 at step 6;
    # nothing at step 7; 2 arrives at step 8.
    plans = drive(sched, reqs(5, 5, 2, prompt=4, arrivals=[0, 2, 8]))
    members = [sorted({d.request_id for d in p.decodes} | {c.request_id for c in p.prefills})
               for p in plans]  # fmt: skip
    assert members == [[0], [0], [0, 1], [0, 1], [0, 1], [1], [1], [], [2], [2]]
    assert [p.since_change for p in plans] == [0, 1, 0, 1, 2, 0, 1, 0, 0, 1]


@pytest.mark.parametrize("seed", range(3))
def test_since_change_agrees_with_the_plans_request_sets(seed):
    """On random workloads, chunked and not: since_change recounted from the plans alone."""
    rng = random.Random(seed)
    requests = [Request(i, rng.randint(1, 40), rng.randint(1, 12), rng.randint(0, 30))
                for i in range(25)]  # fmt: skip
    for chunked in (False, True):
        sched = make_scheduler("continuous", 4, max_num_batched_tokens=48,
                               chunked_prefill=chunked, chunk_size=16 if chunked else None)
        plans = drive(sched, requests)  # fmt: skip
        last, count = frozenset(), 0
        for p in plans:
            now = frozenset(d.request_id for d in p.decodes) | {c.request_id for c in p.prefills}
            count = count + 1 if now == last else 0
            last = now
            assert p.since_change == count


def test_slot_freed_at_end_of_step_t_is_refilled_in_step_t_plus_1():
    sched = ContinuousScheduler(slots=1)
    plans = drive(sched, reqs(3, 2))
    assert [p.admitted for p in plans] == [(0,), (), (), (1,), ()]
    assert sched.recorder.token_steps[1] == [3, 4]


def test_update_returns_finished_ids_and_plan_properties():
    sched = ContinuousScheduler(slots=3)
    sched.add_requests(reqs(1, 2, 1, prompt=4))
    plan = sched.schedule()
    assert (plan.num_prefill_tokens, plan.num_decode_tokens, plan.num_tokens) == (12, 0, 12)
    assert plan.active_slots == (0, 1, 2) and plan.num_output_tokens == 3
    assert sched.update(plan) == [0, 2]
    plan = sched.schedule()
    assert plan.num_tokens == 1 and plan.num_context_tokens == 4
    assert sched.update(plan) == [1] and sched.done and sched.step == 2


def test_requests_wait_for_their_arrival_step_and_idle_steps_are_empty():
    sched = ContinuousScheduler(slots=4)
    plans = drive(sched, reqs(2, 1, arrivals=[3, 1]))
    assert [p.is_empty for p in plans] == [True, False, True, False, False]
    assert plans[1].admitted == (1,) and plans[3].admitted == (0,)


def test_queue_is_first_come_first_served_by_arrival_then_order():
    sched = ContinuousScheduler(slots=1)
    plans = drive(sched, reqs(1, 1, 1, 1, arrivals=[2, 0, 2, 1]))
    admitted = [i for p in plans for i in p.admitted]
    assert admitted == [1, 3, 0, 2]


def test_static_group_pads_finished_slots_and_newcomers_wait():
    sched = StaticScheduler(slots=2)
    plans = drive(sched, reqs(1, 3, 1, 1))
    assert [p.admitted for p in plans] == [(0, 1), (), (), (2, 3)]
    assert [p.padded_slots for p in plans] == [(), (0,), (0,), ()]
    assert [len(p.active_slots) for p in plans] == [2, 1, 1, 2]


def test_static_group_takes_only_arrived_requests():
    sched = StaticScheduler(slots=3)
    plans = drive(sched, reqs(2, 2, 1, arrivals=[0, 0, 1]))
    assert [p.admitted for p in plans] == [(0, 1), (), (2,)]


def test_max_num_seqs_caps_running_below_slots():
    sched = ContinuousScheduler(slots=4, max_num_seqs=2)
    plans = drive(sched, reqs(*[3] * 6))
    assert max(len(p.active_slots) for p in plans) == 2
    assert len(plans) == 9
    static = StaticScheduler(slots=4, max_num_seqs=3)
    assert drive(static, reqs(*[2] * 6))[0].admitted == (0, 1, 2)


# --- chunked prefill and the three schemes ---------------------------------------------------


def test_chunked_prefill_splits_in_order_and_the_last_chunk_yields_token_one():
    sched = ContinuousScheduler(slots=2, chunked_prefill=True, chunk_size=4)
    plans = drive(sched, [Request(0, 10, 2)])
    chunks = [c for p in plans for c in p.prefills]
    assert [(c.start, c.num_tokens, c.completes_prompt) for c in chunks] == [
        (0, 4, False),
        (4, 4, False),
        (8, 2, True),
    ]
    assert sched.recorder.token_steps[0] == [2, 3]
    assert plans[1].num_context_tokens == 4  # the second chunk attends to the first


def test_stall_free_order_decodes_first_then_chunks_under_budget():
    sched = ContinuousScheduler(
        slots=4, max_num_batched_tokens=6, chunked_prefill=True, chunk_size=6
    )
    sched.add_requests([Request(0, 2, 10), Request(1, 2, 10), Request(2, 20, 2)])
    first = sched.schedule()  # two small prompts (4 tokens), then 2 tokens of the long one
    assert [(c.request_id, c.num_tokens) for c in first.prefills] == [(0, 2), (1, 2), (2, 2)]
    sched.update(first)
    second = sched.schedule()  # two decodes first, the long prompt gets what is left
    assert second.num_decode_tokens == 2
    assert [(c.request_id, c.start, c.num_tokens) for c in second.prefills] == [(2, 2, 4)]


def test_mixed_without_chunks_waits_until_the_whole_prompt_fits():
    sched = ContinuousScheduler(slots=4, max_num_batched_tokens=10)
    sched.add_requests([Request(0, 5, 3), Request(1, 5, 3), Request(2, 9, 1)])
    plan = sched.schedule()
    assert plan.admitted == (0, 1) and plan.num_tokens == 10
    sched.update(plan)
    plan = sched.schedule()  # 2 decodes + 9 would exceed 10: the prompt waits
    assert plan.admitted == () and plan.num_tokens == 2


def test_no_mixing_alternates_prefill_only_and_decode_only_steps():
    sched = ContinuousScheduler(slots=2, chunked_prefill=True, chunk_size=4, mixed=False)
    plans = drive(sched, [Request(0, 4, 4), Request(1, 12, 1, arrival_step=1)])
    kinds = ["P" if p.prefills else "D" for p in plans]
    assert kinds == ["P", "D", "P", "D", "P", "D", "P"]  # turns while both have work
    assert sched.recorder.token_steps[0] == [0, 1, 3, 5]  # each token waits one chunk step
    assert sched.recorder.token_steps[1] == [6]


def test_prompt_longer_than_the_budget_is_rejected_without_chunking():
    sched = ContinuousScheduler(slots=2, max_num_batched_tokens=16)
    with pytest.raises(UserError) as e:
        sched.add_requests([Request(7, 17, 1)])
    assert e.value.option == "max_num_batched_tokens" and "request 7" in str(e.value)
    chunked = ContinuousScheduler(slots=2, max_num_batched_tokens=16, chunked_prefill=True)
    assert sum(p.num_prefill_tokens for p in drive(chunked, [Request(7, 17, 1)])) == 17


# --- random workloads: budgets, order and accounting -----------------------------------------


def random_setup(seed: int):
    rng = random.Random(seed)
    slots = rng.randint(1, 6)
    seqs = rng.randint(1, slots)
    budget = rng.choice([None, rng.randint(seqs, 40)])
    chunked = rng.random() < 0.6
    chunk = rng.choice([None, rng.randint(1, budget or 30)]) if chunked else None
    config = dict(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=chunked,
        chunk_size=chunk,
        mixed=rng.random() < 0.7,
    )
    max_prompt = budget if budget and not chunked else 50
    requests = [
        Request(i, rng.randint(1, max_prompt), rng.randint(1, 12), rng.randint(0, 15))
        for i in range(rng.randint(1, 25))
    ]
    return rng.choice(["static", "continuous"]), slots, config, requests


def check_plan_against_state(plan: StepPlan, config: dict, state: dict) -> None:
    """state: request id -> [prefilled, generated]; checks order, budget and chunks."""
    budget = config["max_num_batched_tokens"]
    assert budget is None or plan.num_tokens <= budget
    decoding = {rid for rid, (_, gen) in state.items() if gen > 0}
    if config["mixed"] or not plan.prefills:
        # Stall-free: a step that runs anything runs every decode before any prefill.
        assert {d.request_id for d in plan.decodes} == decoding
    else:
        assert not plan.decodes
    for c in plan.prefills:
        prefilled = state.setdefault(c.request_id, [0, 0])[0]
        assert c.start == prefilled and c.num_tokens >= 1
        assert config["chunk_size"] is None or c.num_tokens <= config["chunk_size"]
    slots = [*plan.active_slots, *plan.padded_slots]
    assert len(slots) == len(set(slots))


def apply_plan(plan: StepPlan, requests: dict[int, Request], state: dict) -> None:
    for d in plan.decodes:
        state[d.request_id][1] += 1
    for c in plan.prefills:
        state[c.request_id][0] += c.num_tokens
        assert c.completes_prompt == (
            state[c.request_id][0] == requests[c.request_id].prompt_tokens
        )
        state[c.request_id][1] += c.completes_prompt
    for rid in [r for r, (_, g) in state.items() if g == requests[r].output_tokens]:
        del state[rid]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9))
def test_budgets_order_and_accounting_on_random_workloads(seed):
    policy, slots, config, requests = random_setup(seed)
    sched = make_scheduler(policy, slots, **config)
    sched.add_requests(requests)
    by_id, state, chunks = {r.id: r for r in requests}, {}, {r.id: [] for r in requests}
    admitted = []
    while not sched.done:
        assert sched.step < 10_000, "no progress"
        plan = sched.schedule()
        check_plan_against_state(plan, config, state)
        assert sched.num_running <= config["max_num_seqs"]
        admitted += plan.admitted
        # First come, first served: prefills run in admission order, none overtakes.
        pending = [i for i in admitted if sum(chunks[i]) < by_id[i].prompt_tokens]
        assert [c.request_id for c in plan.prefills] == pending[: len(plan.prefills)]
        for c in plan.prefills:
            chunks[c.request_id].append(c.num_tokens)
        sched.update(plan)
        apply_plan(plan, by_id, state)
    assert not state and sorted(sched.finished) == sorted(by_id)
    assert admitted == [r.id for r in sorted(requests, key=lambda r: r.arrival_step)]  # FCFS
    for r in requests:
        assert len(sched.recorder.token_steps[r.id]) == r.output_tokens
        assert sum(chunks[r.id]) == r.prompt_tokens
        assert sched.recorder.token_steps[r.id][0] >= r.arrival_step


# --- settings and misuse ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings_", "option"),
    [
        ({"slots": 0}, "slots"),
        ({"slots": -1}, "slots"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_seqs": 5}, "max_num_seqs"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"max_num_batched_tokens": -8}, "max_num_batched_tokens"),
        ({"max_num_batched_tokens": 3}, "max_num_batched_tokens"),  # fewer than 4 seqs
        ({"chunked_prefill": True, "chunk_size": 0}, "chunk_size"),
        ({"chunked_prefill": True, "chunk_size": -4}, "chunk_size"),
        ({"chunked_prefill": True, "chunk_size": 65, "max_num_batched_tokens": 64}, "chunk_size"),
        ({"chunk_size": 16}, "chunk_size"),  # without chunked prefill
    ],
)
def test_bad_settings_raise_user_error_naming_the_field(settings_, option):
    kwargs = {"slots": 4, **settings_}
    for policy in ("static", "continuous"):
        with pytest.raises(UserError) as e:
            make_scheduler(policy, **kwargs)
        assert e.value.option == option and "\n" not in str(e.value)


def test_unknown_policy_is_a_bug_not_input():
    with pytest.raises(ValueError, match="unknown policy 'fifo'"):
        make_scheduler("fifo", 4)


def test_article_rule_only_with_default_settings():
    assert SchedulerConfig(8).article_rule
    assert not SchedulerConfig(8, max_num_batched_tokens=64).article_rule
    assert not SchedulerConfig(8, chunked_prefill=True).article_rule
    assert not SchedulerConfig(8, mixed=False).article_rule
    assert not SchedulerConfig(8, max_num_seqs=4).article_rule


def test_contract_misuse_is_caught():
    sched = ContinuousScheduler(slots=1)
    sched.add_requests(reqs(2))
    plan = sched.schedule()
    with pytest.raises(AssertionError):
        sched.schedule()
    sched.update(plan)
    with pytest.raises(AssertionError):
        sched.update(plan)
