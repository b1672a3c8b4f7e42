"""What `benchbatch serve` adds under the HTTP: Scheduler.cancel (a request dropped between
steps, waiting or running, its slot and blocks freed as a finished one's) and the split of
the cores between the model thread and the HTTP loop (runtime/cores.py's plan_cores)."""

from __future__ import annotations

import os

import pytest

from benchbatch.core.kvblocks import KVBudget
from benchbatch.core.scheduler import make_scheduler
from benchbatch.core.workload import Request
from benchbatch.runtime import cores


def step(sched):
    plan = sched.schedule()
    return plan, sched.update(plan)


def req(i: int, output: int = 10, prompt: int = 4) -> Request:
    return Request(i, prompt, output)


def test_cancelling_a_running_request_frees_its_slot_for_the_next_step():
    sched = make_scheduler("continuous", 2)
    sched.add_requests([req(0), req(1), req(2)])
    plan, _ = step(sched)
    assert plan.admitted == (0, 1)
    assert sched.cancel(0)
    plan, _ = step(sched)
    assert plan.admitted == (2,) and plan.prefills[0].slot == 0  # 0's slot, at once
    assert [d.request_id for d in plan.decodes] == [1]
    while not sched.done:
        step(sched)
    assert sorted(sched.finished) == [1, 2]  # the cancelled one never finishes
    assert not sched.cancel(0) and not sched.cancel(99)


def test_cancelling_a_waiting_request_takes_it_off_the_queue():
    sched = make_scheduler("continuous", 1)
    sched.add_requests([req(0, 3), req(1), req(2, 2)])
    step(sched)
    assert sched.cancel(1) and sched.num_waiting == 1
    admitted = []
    while not sched.done:
        plan, _ = step(sched)
        admitted += plan.admitted
    assert admitted == [2] and sched.finished == [0, 2]


def test_a_cancelled_static_member_pads_until_its_group_ends():
    sched = make_scheduler("static", 2)
    sched.add_requests([req(0, 5), req(1, 5), req(2, 1)])
    step(sched)
    sched.cancel(0)
    plan, _ = step(sched)
    assert plan.padded_slots == (0,) and not plan.admitted  # the group still runs
    while 1 in [d.request_id for d in plan.decodes]:
        plan, _ = step(sched)
    assert plan.admitted == (2,)


def test_a_cancelled_request_gives_back_its_kv_blocks():
    sched = make_scheduler("continuous", 2, kv=KVBudget(blocks=8, block_size=4))
    sched.add_requests([req(0, 10, 8), req(1, 10, 8)])
    plan, _ = step(sched)
    held = plan.kv_blocks
    sched.cancel(0)
    plan, _ = step(sched)
    assert plan.kv_blocks < held and [d.request_id for d in plan.decodes] == [1]


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: None, raising=False)


def test_the_model_thread_gets_its_threads_cores_and_the_http_loop_the_rest(four_cores):
    plan = cores.plan_cores(None)
    assert (plan.threads, plan.model_cores, plan.http_cores) == (3, (1, 2, 3), (0,))
    plan = cores.plan_cores(1)
    assert (plan.threads, plan.model_cores, plan.http_cores) == (1, (3,), (0, 1, 2))
    plan = cores.plan_cores(8)  # more threads than cores: the HTTP loop still keeps one
    assert (plan.model_cores, plan.http_cores) == ((1, 2, 3), (0,)) and "share" in plan.why
    plan = cores.plan_cores(2, pin=False)
    assert (plan.threads, plan.model_cores, plan.http_cores) == (2, None, None)
    plan = cores.plan_cores(1, cpus=[4, 6])  # the process's CPUs before a run pinned its thread
    assert (plan.model_cores, plan.http_cores) == ((6,), (4,))


def test_the_model_thread_takes_the_least_busy_cores(four_cores):
    busy = {0: 0.25, 1: 0.9, 2: 0.02, 3: 0.97}  # another process pinned to CPUs 1 and 3
    plan = cores.plan_cores(1, busy=busy)
    assert (plan.model_cores, plan.http_cores) == ((2,), (0, 1, 3)) and "least busy" in plan.why
    plan = cores.plan_cores(2, busy=busy)
    assert (plan.model_cores, plan.http_cores) == ((0, 2), (1, 3))
    even = {0: 0.31, 1: 0.28, 2: 0.33, 3: 0.3}  # equal to a tenth: the first ones, away
    plan = cores.plan_cores(1, busy=even)  # from the last, where benchbatch's runs pin theirs
    assert (plan.model_cores, plan.http_cores) == ((0,), (1, 2, 3))
    assert cores.plan_cores(1, busy={0: 0.0}).model_cores == (3,)  # CPUs it cannot say: as is


def test_one_core_is_not_pinned(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)
    plan = cores.plan_cores(None)
    assert (plan.threads, plan.model_cores) == (1, None) and "one CPU" in plan.why
