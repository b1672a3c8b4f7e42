"""Mutation check: small deliberate breaks that the test suite must catch.

Each break is one exact piece of source text and its replacement (a label swapped, a
threshold moved, padding dropped, a flag not passed on). For each, the repository is
copied to a temporary folder (the working tree is never touched), the break applied to the
copy, and the break's test files run there: a break whose tests still pass SURVIVED, and
says which guard is missing. A break whose text is no longer found (exactly once) is
STALE: the list must follow the code, so that also fails the check.

    python scripts/mutations.py            # every break; exit 1 if any survived or is stale
    python scripts/mutations.py -k verdict # breaks whose name contains 'verdict'
    python scripts/mutations.py --list     # the breaks and their test files, nothing run

First the break's test files run on the unbroken copy (the baseline): a test that fails
already would make every break look caught.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Break:
    name: str
    path: str  # relative to the repository root
    find: str  # must occur exactly once in the file
    replace: str
    tests: tuple[str, ...]  # pytest targets: files or node ids


def tests(path: str, *names: str) -> tuple[str, ...]:
    """pytest node ids: the tests of `path` that guard a break (all of them when none)."""
    return tuple(f"{path}::{n}" for n in names) or (path,)


REPORT = tests(
    "tests/test_report.py",  # behaviour at the thresholds, not the constants' values
    "test_a_rule_flips_exactly_at_its_thresholds",
    "test_batching_flips_at_a_quarter_of_perfect_and_at_2x_and_1_25x",
    "test_throughput_over_latency_flips_at_twice_as_fast_and_a_doubled_step",
    "test_claims_use_their_rules_at_the_thresholds",
    "test_an_uneven_real_run_is_noted_above_one_and_a_half",
)
SETTLE = (
    *tests("tests/test_simulate.py",
           "test_a_step_after_its_batch_changed_pays_the_settle_term_and_its_decay"),
    *tests("tests/test_endpoint_predict.py",
           "test_a_server_whose_steps_settle_after_its_batch_changes_is_calibrated_and_predicted",
           "test_decode_episodes_last_as_long_as_the_workloads_median_request"),
)  # fmt: skip
PAIRS = tests(
    "tests/test_calibration.py",
    "test_a_prompt_pair_term_is_recovered_beside_the_others",
    "test_prompt_pairs_are_the_pairs_the_engines_causal_kernel_attends",
)
ENGINE = tests(
    "tests/test_engine.py",
    "test_real_run_takes_the_simulated_steps",
    "test_static_computes_padding_and_continuous_does_not",
    "test_step_records_count_what_the_model_was_fed",
    "test_static_decode_batch_is_the_active_plus_the_padded_slots",
)
GRAPHS = tests(
    "tests/test_graph_path.py",
    "test_the_flag_reaches_the_step_timer",
    "test_a_step_timed_alone_gets_the_flag_too",
)
ACCOUNTING = tests("tests/test_accounting.py")
SCHEDULER = (*tests("tests/test_scheduler.py"), *tests("tests/test_simulate.py"))
SIMULATE = tests("tests/test_simulate.py")


def threshold(name: str, find: str, replace: str) -> Break:
    return Break(f"verdict: {name}", "benchbatch/output/report/claims.py", find, replace, REPORT)


# Issue 27's five: each survived the whole suite in a deliberate-break check before its test.
BREAKS_ISSUE_27 = tests("tests/test_deliberate_breaks.py")

BREAKS = [
    # --- the simulation's error as reproduce's claim P; calibration conditions; progress ---
    # --- requests streamed in bursts; one load-class rule ---
    Break(
        "bursts: a measured point's requests counted whether or not they can be judged",
        "benchbatch/experiments/serve/endpoint_rows.py",
        '    row["judged_requests"] = sum(ec.judged(r) for r in records)',
        '    row["judged_requests"] = sum(r.ok for r in records)',
        tests("tests/test_endpoint_predict.py",
              "test_requests_streamed_in_bursts_are_counted_and_said"),
    ),
    Break(
        "bursts: requests.csv never marks a request in a burst",
        "benchbatch/experiments/serve/endpoint_rows.py",
        '        "in_burst": ec.stalled(s),',
        '        "in_burst": False,',
        tests("tests/test_endpoint_predict.py",
              "test_requests_streamed_in_bursts_are_counted_and_said"),
    ),
    Break(
        "bursts: a point whose requests came in bursts not said",
        "benchbatch/experiments/serve/endpoint.py",
        '    if row["burst_requests"] > ec.BURSTS_WARN * max(1, row["judged_requests"]):',
        '    if row["burst_requests"] > max(1, row["judged_requests"]):',
        tests("tests/test_endpoint_predict.py",
              "test_requests_streamed_in_bursts_are_counted_and_said"),
    ),
    Break(
        "bursts: a calibration counts its one-token newcomers among the judged",
        "benchbatch/experiments/serve/predict.py",
        "                streamed[0] += sum(ec.judged(r) for r in records)",
        "                streamed[0] += sum(r.ok for r in records)",
        tests("tests/test_endpoint_predict.py",
              "test_requests_streamed_in_bursts_are_counted_and_said"),
    ),
    Break(
        "bursts: a first calibration with nothing to read does not say it came in bursts",
        "benchbatch/experiments/serve/predict.py",
        'came in bursts, {whose}" if held else ""',
        'came in bursts, {whose}" if False else ""',
        tests("tests/test_endpoint_predict.py",
              "test_a_server_that_holds_every_token_back_is_one_line_before_any_point"),
    ),
    Break(
        "load class: a calibration's own threshold, not the run's",
        "benchbatch/core/machine.py",
        '    klass = load_class(load, cores, own_threads)\n    if klass == "busy"',
        '    klass = "busy" if max(0.0, load - own_threads) / cores > 0.6 else "quiet"\n'
        '    if klass == "busy"',
        tests("tests/test_calibration.py", "test_the_load_class_follows_the_load_per_core"),
    ),
    Break(
        "claim P: partly however few pairs are within",
        "benchbatch/output/report/beyond_claims.py",
        "(PARTLY if 2 * hit >= len(judged) else FAILS)",
        "(PARTLY if hit >= 0 else FAILS)",
        tests("tests/test_report.py",
              "test_claim_p_holds_when_every_pair_is_within_and_partly_at_half"),
    ),
    Break(
        "calibration conditions: another host not flagged",
        "benchbatch/core/saved_calibration.py",
        'FLAGGED = ("host_id", "benchbatch", ',
        'FLAGGED = ("benchbatch", ',
        tests("tests/test_calibration.py", "test_each_other_condition_is_flagged_by_name",
              "test_the_engines_conditions_name_the_host_without_its_name"),
    ),
    Break(
        "progress: the run's estimate not counted down before the first item",
        "benchbatch/output/progress.py",
        "    if not done and expected_s is not None and elapsed is not None and total is not None:",
        "    if False:",
        tests("tests/test_progress.py",
              "test_before_the_first_item_the_runs_estimate_counts_down"),
    ),
    Break(
        "progress: a log line only when an item ends",
        "benchbatch/output/progress.py",
        "            with log.heartbeat():\n                yield log\n",
        "            yield log\n",
        tests("tests/test_progress.py",
              "test_a_log_line_every_ten_seconds_whether_or_not_an_item_ended",
              "test_the_heartbeat_thread_ticks_and_stops_with_its_task",
              "test_a_task_logged_to_a_file_keeps_its_heartbeat_open_while_it_runs"),
    ),
    Break(
        "reproduce's serving cells without their units",
        "benchbatch/output/report/beyond.py",
        "{fmt(ttft)} s / {fmt(1e3 * tpot) if tpot is not None else '-'} ms, ",
        "{fmt(ttft)} / {fmt(1e3 * tpot) if tpot is not None else '-'}, ",
        tests("tests/test_reproduce.py", "test_the_serving_cells_carry_their_units"),
    ),
    Break(
        "endpoint calibration: a burst told by its longest gap over a tenth of the span",
        "benchbatch/core/endpoint_calibration.py",
        "BURST_SHARE = 0.5  #",
        "BURST_SHARE = 0.1  #",
        tests("tests/test_endpoint_predict.py",
              "test_a_request_streamed_in_bursts_is_told_from_steady_streaming"),
    ),
    Break(
        "client waits: the time on a CPU read as the wait for one",
        "benchbatch/net/waits.py",
        "return int(os.pread(self.fd, 128, 0).split()[1]) / 1e9",
        "return int(os.pread(self.fd, 128, 0).split()[0]) / 1e9",
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "client waits: a burst put on the client whatever it waited",
        "benchbatch/core/endpoint_calibration.py",
        "    return record.client_wait_s >= 0.5 * stall",
        "    return record.client_wait_s >= 0",
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "client waits: a request's wait taken over the whole run",
        "benchbatch/net/client.py",
        "        rec.client_wait_s = self._waits.now() - waited",
        "        rec.client_wait_s = self._waits.now()",
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "client waits: a calibration's bursts never put on the client",
        "benchbatch/experiments/serve/predict.py",
        "                streamed[2] += sum(ec.read_late(r) for r in records)",
        "                streamed[2] += 0",
        tests("tests/test_endpoint_predict.py",
              "test_bursts_read_late_by_a_waiting_client_are_put_on_the_client"),
    ),
    Break(
        "client realtime: the client's thread left at its priority",
        "benchbatch/net/client.py",
        "        if self.realtime:  # this thread: the loop's",
        "        if False:  # this thread: the loop's",
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "client priority: auto never asks for real-time",
        "benchbatch/net/waits.py",
        '    if asked == "normal":\n        return "normal", None',
        '    if asked != "realtime":\n        return "normal", None',
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "client priority: auto resolved but the streams left at normal",
        "benchbatch/experiments/serve/endpoint.py",
        "    opts = replace(opts, client_priority=info[\"client_priority\"])  # auto: as resolved",
        "",
        tests("tests/test_client_waits.py"),
    ),
    Break(
        "endpoint prediction: a point without enough calibration steps ends the run",
        "benchbatch/experiments/serve/predict.py",
        "            if pooled_model is None and len(parts) == 1:",
        "            if len(parts) == 1:",
        tests("tests/test_endpoint_predict.py",
              "test_a_point_whose_calibrations_gave_too_few_steps_is_priced_by_the_pooled_fit"),
    ),
    # --- issue 27: breaks that once survived the whole suite ----------------------------
    Break(
        "step-cost fit: the weights squared instead of their square roots",
        "benchbatch/core/step_model.py",
        "else [w**0.5 for w in weights]",
        "else [w**2 for w in weights]",
        BREAKS_ISSUE_27,
    ),
    Break(
        "calibration fit: each step's row scaled by its weight, not the weight's square root",
        "benchbatch/core/calibration.py",
        "    return 1.0 / pred\n",
        "    return 1.0 / pred**2\n",
        (*BREAKS_ISSUE_27, *tests("tests/test_calibration.py",
                                  "test_relative_weighting_fits_the_1ms_steps_and_the_1s_steps_alike")),
    ),
    Break(
        "activation bytes: the residual adds' term halved",
        "benchbatch/core/accounting.py",
        "    residuals = 2 * 3 * h  # two adds: read two, write one",
        "    residuals = 3 * h  # two adds: read two, write one",
        BREAKS_ISSUE_27,
    ),
    Break(
        "all-reduce bus bytes: the ring's 2 (n - 1) / n without the rank count",
        "benchbatch/core/accounting.py",
        "    return message_bytes * 2 * (ranks - 1) / ranks",
        "    return message_bytes * 2",
        BREAKS_ISSUE_27,
    ),
    Break(
        "paged KV: a sequence's peak counted one token too many",
        "benchbatch/core/kvblocks.py",
        "        return prompt_tokens + output_tokens - 1",
        "        return prompt_tokens + output_tokens",
        BREAKS_ISSUE_27,
    ),
    Break(
        "timing: a step's time the mean of its repeats, not the median",
        "benchbatch/runtime/timing.py",
        "    def median_ms(self) -> float:\n        return statistics.median(self.times_ms)",
        "    def median_ms(self) -> float:\n        return statistics.mean(self.times_ms)",
        BREAKS_ISSUE_27,
    ),
    # --- compare ------------------------------------------------------------------------
    Break(
        "compare labels run A's rows as run B (and B's as A)",
        "benchbatch/output/compare.py",
        "frames = [r.tables[table].assign(run=r.label) for r in runs if table in r.tables]",
        "frames = [r.tables[table].assign(run=runs[-1 - i].label)\n"
        "                  for i, r in enumerate(runs) if table in r.tables]",
        tests("tests/test_compare.py", "test_each_run_rows_in_the_merged_csv_are_its_own_csv"),
    ),
    Break(
        "compare: first_seed keeps every seed",
        "benchbatch/output/compare.py",
        'keep.append(rows if seeds.empty else rows[rows["seed"] == seeds.iloc[0]])',
        "keep.append(rows)",
        tests("tests/test_compare.py", "test_first_seed_keeps_each_run_first_seed_only"),
    ),
    Break(
        "compare: the ratio inverted (first over second)",
        "benchbatch/output/compare.py",
        "    return b / a",
        "    return a / b",
        tests("tests/test_compare.py", "test_the_printed_ratio_is_the_second_run_over_the_first"),
    ),
    # --- verdicts -------------------------------------------------------------------------
    threshold("prefill holds 10x -> 12x", "PREFILL_RULE = Rule(10.0,", "PREFILL_RULE = Rule(12.0,"),
    threshold("prefill holds 10x -> 9x", "PREFILL_RULE = Rule(10.0,", "PREFILL_RULE = Rule(9.0,"),
    threshold("prefill partly 2x -> 2.5x", "Rule(10.0, 2.0,", "Rule(10.0, 2.5,"),
    threshold("speedup holds 2x -> 2.5x", "SPEEDUP_RULE = Rule(2.0,", "SPEEDUP_RULE = Rule(2.5,"),
    threshold("speedup partly 1.2x -> 1.45x", "Rule(2.0, 1.2,", "Rule(2.0, 1.45,"),
    threshold("speedup partly 1.2x -> 1.1x", "Rule(2.0, 1.2,", "Rule(2.0, 1.1,"),
    threshold(
        "batching: a quarter of perfect -> 0.3",
        "BATCHING_MIN_PARTLY = 0.25, 2.0, 1.25",
        "BATCHING_MIN_PARTLY = 0.3, 2.0, 1.25",
    ),
    threshold(
        "batching holds 2x -> 2.5x",
        "BATCHING_MIN_PARTLY = 0.25, 2.0, 1.25",
        "BATCHING_MIN_PARTLY = 0.25, 2.5, 1.25",
    ),
    threshold(
        "batching partly 1.25x -> 1.5x",
        "BATCHING_MIN_PARTLY = 0.25, 2.0, 1.25",
        "BATCHING_MIN_PARTLY = 0.25, 2.0, 1.5",
    ),
    threshold("step time at most doubled -> x3", "LATENCY_HOLDS = 2.0", "LATENCY_HOLDS = 3.0"),
    threshold(
        "throughput over latency 2 -> 7",
        "THROUGHPUT_OVER_LATENCY = 2.0",
        "THROUGHPUT_OVER_LATENCY = 7.0",
    ),
    threshold(
        "a rule's 'at or above' -> 'above'", "if value >= self.holds:", "if value > self.holds:"
    ),
    threshold(
        "latency's 'at most doubled' -> 'less than doubled'",
        "latency_ratio <= LATENCY_HOLDS",
        "latency_ratio < LATENCY_HOLDS",
    ),
    threshold("uneven real run note 1.5 -> 2", "UNEVEN_STEPS = 1.5", "UNEVEN_STEPS = 2.0"),
    # --- the real engine -------------------------------------------------------------------
    Break(
        "engine: static drops its padded slots",
        "benchbatch/runtime/run_state.py",
        "decode_slots = sorted([d.slot for d in plan.decodes] + list(plan.padded_slots))",
        "decode_slots = sorted([d.slot for d in plan.decodes])",
        ENGINE,
    ),
    Break(
        "engine: the step record loses the padded rows",
        "benchbatch/runtime/run_state.py",
        "rows_padded = sum(s in padded for s in slots)",
        "rows_padded = 0",
        ENGINE,
    ),
    Break(
        "engine: prefill tokens counted as rows",
        "benchbatch/runtime/run_state.py",
        "prefill_tokens += call.tokens.numel()",
        "prefill_tokens += rows",
        ENGINE,
    ),
    # --- CUDA graphs reach the timer ------------------------------------------------------
    Break(
        "graphs: run_step ignores --no-cuda-graphs",
        "benchbatch/runtime/steps.py",
        "timed = lambda: time_step(model, step, opts, cuda_graphs, kv_layout=kv_layout,",
        "timed = lambda: time_step(model, step, opts, True, kv_layout=kv_layout,",
        GRAPHS,
    ),
    Break(
        "graphs: time_step replays a graph without being asked",
        "benchbatch/runtime/steps.py",
        "return cuda_graphs and backend.of(dev).graphs",
        "return backend.of(dev).graphs",
        tests("tests/test_graph_path.py", "test_a_graph_is_replayed_on_cuda_when_asked"),
    ),
    Break(
        "graphs: the sweep probe drops the flag",
        "benchbatch/experiments/sweep/probe.py",
        "measured = steps.run_group(model, dtype, group, timing, cuda_graphs, **layout)",
        "measured = steps.run_group(model, dtype, group, timing, True, **layout)",
        GRAPHS,
    ),
    Break(
        "graphs: the phases probe drops the flag",
        "benchbatch/experiments/phases/probe.py",
        "yield from steps.run_group(model, dtype, group, timing, cuda_graphs, **layout)",
        "yield from steps.run_group(model, dtype, group, timing, True, **layout)",
        GRAPHS,
    ),
    Break(
        "graphs: piggyback drops the flag",
        "benchbatch/experiments/piggyback/probe.py",
        "makers = [functools.partial(_prepare, model, t, timed, cuda_graphs) for t in group]",
        "makers = [functools.partial(_prepare, model, t, timed, True) for t in group]",
        tests("tests/test_graph_path.py", "test_the_flag_reaches_the_mixed_step_timer"),
    ),
    # --- accounting ---------------------------------------------------------------------
    Break(
        "accounting: attention FLOPs halved",
        "benchbatch/core/accounting.py",
        "attention_flops=cfg.layers * 4 * local.q_dim * pairs",
        "attention_flops=cfg.layers * 2 * local.q_dim * pairs",
        ACCOUNTING,
    ),
    Break(
        "accounting: a query does not see itself",
        "benchbatch/core/accounting.py",
        "tokens * (tokens + 1) // 2",
        "tokens * (tokens - 1) // 2",
        ACCOUNTING,
    ),
    Break(
        "accounting: the KV read skips the new tokens",
        "benchbatch/core/accounting.py",
        "kv_read_bytes=batch * (context + tokens) * kv_bytes_per_token(cfg, dtype, tp)",
        "kv_read_bytes=batch * context * kv_bytes_per_token(cfg, dtype, tp)",
        ACCOUNTING,
    ),
    Break(
        "accounting: logits for every token",
        "benchbatch/core/accounting.py",
        "logit_rows = batch * logits_per_seq",
        "logit_rows = batch * tokens * logits_per_seq",
        ACCOUNTING,
    ),
    # --- scheduler and simulator -----------------------------------------------------------
    Break(
        "scheduler: static admits before its group ends",
        "benchbatch/core/scheduler.py",
        "self.step)\n        if self.num_running == 0:  # the group is over",
        "self.step)\n        if True:  # the group is over",
        SCHEDULER,
    ),
    Break(
        "scheduler: a request is admitted a step after it arrives",
        "benchbatch/core/scheduler_base.py",
        "if self.items and self.items[0].arrival_step <= step:",
        "if self.items and self.items[0].arrival_step < step:",
        SCHEDULER,
    ),
    Break(
        "scheduler: a prompt that exactly fits the budget waits",
        "benchbatch/core/scheduler_base.py",
        "return prompt_left if prompt_left <= budget_left else 0",
        "return prompt_left if prompt_left < budget_left else 0",
        SCHEDULER,
    ),
    Break(
        "scheduler: decode context one token too long",
        "benchbatch/core/scheduler_base.py",
        "DecodeEntry(slot, s.request.id, s.request.prompt_tokens + s.generated - 1)",
        "DecodeEntry(slot, s.request.id, s.request.prompt_tokens + s.generated)",
        SCHEDULER,
    ),
    Break(
        "simulate: continuous frees a slot a step late",
        "benchbatch/core/article.py",
        "        take(free, start + n)\n        keep(start)\n    return starts\n",
        "        take(free, start + n + 1)\n        keep(start)\n    return starts\n",
        SIMULATE,
    ),
    Break(
        "simulate: a static group one request too large",
        "benchbatch/core/article.py",
        "firsts = np.arange(0, n, slots)",
        "firsts = np.arange(0, n, slots + 1)",
        SIMULATE,
    ),
    Break(
        "simulate: speedup over static inverted",
        "benchbatch/core/simulate.py",
        '"speedup_vs_static": static_time / r.total_time if static_time else None',
        '"speedup_vs_static": r.total_time / static_time if static_time else None',
        SIMULATE,
    ),
    Break(
        "simulate: first token one step early",
        "benchbatch/core/article.py",
        "workload.id, workload.arrival_step, starts + 1, starts + outputs,",
        "workload.id, workload.arrival_step, starts, starts + outputs,",
        SIMULATE,
    ),
    # --- KV blocks under a token budget, and a server's pool ------------------------------------
    Break(
        "scheduler: a KV preemption takes the oldest running request",
        "benchbatch/core/scheduler_base.py",
        "victim = max(running, key=lambda s: s.admission)",
        "victim = min(running, key=lambda s: s.admission)",
        tests("tests/test_kvblocks.py"),
    ),
    Break(
        "scheduler: a chunked request is admitted with blocks for its whole prompt",
        "benchbatch/core/scheduler.py",
        "new.append(self._admit_head(n))",
        "new.append(self._admit_head())",
        tests("tests/test_kvblocks.py"),
    ),
    Break(
        "predict: vLLM's null block handed out",
        "benchbatch/experiments/serve/predict.py",
        "NULL_BLOCKS = 1",
        "NULL_BLOCKS = 0",
        tests("tests/test_endpoint_predict.py"),
    ),
    Break(
        "calibration: the host gap between steps left out",
        "benchbatch/core/calibration.py",
        "(r[\"step_ms\"] + gap) / 1e3 for r in rows",
        "r[\"step_ms\"] / 1e3 for r in rows",
        tests("tests/test_calibration.py"),
    ),
    Break(
        "knee: the bisection reports the rate above the knee",
        "benchbatch/experiments/serve/knees.py",
        "        lo, hi = (mid, hi) if ok else (lo, mid)\n    return lo\n",
        "        lo, hi = (mid, hi) if ok else (lo, mid)\n    return hi\n",
        tests("tests/test_knee.py"),
    ),
    Break(
        "knee: the slower and faster steps swapped",
        "benchbatch/experiments/serve/knees.py",
        '(("slow", 1 + STEP_COST_SPREAD), ("fast", 1 - STEP_COST_SPREAD))',
        '(("slow", 1 - STEP_COST_SPREAD), ("fast", 1 + STEP_COST_SPREAD))',
        tests("tests/test_knee.py"),
    ),
    Break(
        "real points simulated at the core share's inverse",
        "benchbatch/core/cpu_clock.py",
        "    return cpu_cost.scaled(1.0 / share)",
        "    return cpu_cost.scaled(share)",
        tests("tests/test_calibration.py"),
    ),
    Break(
        "conclusion ranges: the denominator's spread taken the wrong way round",
        "benchbatch/core/noise.py",
        'under["step_ms"] / under["step_ms_p10"]',
        'under["step_ms_p90"] / under["step_ms"]',
        tests("tests/test_conclusion_ranges.py"),
    ),
    Break(
        "knee: the slower steps' capacity taken as the faster's",
        "benchbatch/experiments/serve/knees.py",
        "            if rate > cap / factor:",
        "            if rate > cap * factor:",
        tests("tests/test_knee.py"),
    ),
    Break(
        "knee: a policy within the SLO past its capacity given its sustained rate",
        "benchbatch/experiments/serve/knees.py",
        "            out.append((row[\"policy\"], cap, cap, cap))",
        "            out.append((row[\"policy\"], lo, lo, cap))",
        tests("tests/test_knee.py"),
    ),
    Break(
        "row blocks: a decode step's rows rounded down to whole blocks",
        "benchbatch/core/step_model.py",
        "return -(-rows // block) if rows > 0 and block > 0 else 0",
        "return rows // block if rows > 0 and block > 0 else 0",
        tests("tests/test_calibration.py",
              "test_the_simulator_prices_row_blocks_and_prefill_steps",
              "test_row_blocks_and_a_prefill_steps_cost_are_recovered_beside_the_others"),
    ),
    Break(
        "row blocks: a decode-only step also priced per sequence and decode token in the fit",
        "benchbatch/core/calibration.py",
        "            x[lone, 1 + FEATURES.index(name)] = 0.0",
        "            pass",
        tests("tests/test_calibration.py",
              "test_row_blocks_and_a_prefill_steps_cost_are_recovered_beside_the_others",
              "test_an_executed_steps_price_is_what_the_simulation_charges_its_plan"),
    ),
    Break(
        "row blocks: kept however little they fit",
        "benchbatch/core/calibration.py",
        "BLOCK_GAIN = 0.35",
        "BLOCK_GAIN = 0.0",
        tests("tests/test_calibration.py", "test_a_calibration_without_stairs_keeps_no_row_blocks"),
    ),
    Break(
        "layout: three timings a layout, where a burst decides the choice",
        "benchbatch/runtime/layout.py",
        "ROUNDS = 9",
        "ROUNDS = 3",
        tests("tests/test_layout.py",
              "test_a_burst_in_four_of_a_layouts_timings_does_not_decide_the_choice"),
    ),
    Break(
        "real rates: the dearer simulation made cheaper",
        "benchbatch/experiments/serve/real.py",
        "dear = cost.scaled(1 + STEP_COST_SPREAD)",
        "dear = cost.scaled(1 - STEP_COST_SPREAD)",
        tests("tests/test_serve.py",
              "test_the_dearer_simulation_prices_every_step_ten_percent_higher"),
    ),
    Break(
        "real rates: each policy's last point below saturation taken as priced, not dearer",
        "benchbatch/experiments/serve/rate_choice.py",
        "| saturation_by_policy(dear or (), MATCHED)",
        "| saturation_by_policy((), MATCHED)",
        tests("tests/test_serve.py",
              "test_real_rates_take_the_last_point_below_saturation_with_dearer_steps"),
    ),
    Break(
        "a shared core's whole-core simulation at the point's own share",
        "benchbatch/experiments/serve/real.py",
        "beside(point, w, setup, at_share(cost, cpu_cost, 1.0), cost, n)",
        "beside(point, w, setup, at_share(cost, cpu_cost, 0.5), cost, n)",
        tests("tests/test_calibration.py"),
    ),
    Break(
        "occupancy's estimate: the calibration's runs counted, not their steps",
        "benchbatch/experiments/occupancy/real.py",
        "steps = cb.total_steps(calibration_runs(",
        "steps = len(calibration_runs(",
        tests("tests/test_occupancy_cli.py"),
    ),
    Break(
        "knee: bisected to ten times its width",
        "benchbatch/experiments/serve/knees.py",
        "    while hi / lo - 1 > width:\n",
        "    while hi / lo - 1 > 10 * width:\n",
        tests("tests/test_knee.py"),
    ),
    Break(
        "since_change: never reset when a step's requests change",
        "benchbatch/core/scheduler_base.py",
        "self._since_change + 1 if members == self._members else 0",
        "self._since_change + 1",
        tests("tests/test_scheduler.py"),
    ),
    Break(
        "prompt pairs: a later chunk's pairs counted as if nothing were cached before it",
        "benchbatch/core/step_model.py",
        "for c in plan.prefills if c.start == 0)",
        "for c in plan.prefills)",
        PAIRS,
    ),
    Break(
        "prompt pairs: n^2 / 2, the diagonal (each token seeing itself) left out",
        "benchbatch/core/step_model.py",
        "c.num_tokens * (c.num_tokens + 1) // 2 for c",
        "c.num_tokens * c.num_tokens // 2 for c",
        PAIRS,
    ),
    Break(
        "prompt pairs: the fitted term never priced",
        "benchbatch/core/step_model.py",
        "            cost += self.per_prompt_pair_s * prompt_pairs(plan)\n",
        "            cost += 0.0\n",
        PAIRS,
    ),
    Break(
        "settle: every step priced at the change's cost, the decay dropped",
        "benchbatch/core/step_model.py",
        "cost += self.settle_s * self.settle_decay**plan.since_change",
        "cost += self.settle_s",
        SETTLE,
    ),
    Break(
        "settle: scaling a model scales its decay too",
        "benchbatch/core/step_model.py",
        """kept = ("settle_decay", "row_block", "wake_power")""",
        """kept = ("row_block", "wake_power")""",
        SETTLE,
    ),
    Break(
        "row blocks: scaling a model scales its block size too",
        "benchbatch/core/step_model.py",
        """kept = ("settle_decay", "row_block", "wake_power")""",
        """kept = ("settle_decay", "wake_power")""",
        tests("tests/test_calibration.py",
              "test_the_simulator_prices_row_blocks_and_prefill_steps"),
    ),
    Break(
        "settle: the step after a mixed one (the newcomer gone) not counted as a change",
        "benchbatch/core/endpoint_calibration.py",
        "return i - first if i <= j - 1 else (0 if i == j else i - (j + 1))",
        "return i - first if i <= j - 1 else (0 if i == j else i - first)",
        SETTLE,
    ),
    Break(
        "endpoint calibration: episodes sent at once, the server never left idle",
        "benchbatch/core/endpoint_calibration.py",
        "        return [pause] * episode.concurrency\n",
        "        return [0.0] * episode.concurrency\n",
        tests("tests/test_endpoint_predict.py",
              "test_the_server_idles_before_each_episode_as_the_next_points_arrivals_do"),
    ),
    Break(
        "endpoint calibration: the idle before the last calibration taken from no rate",
        "benchbatch/experiments/serve/endpoint.py",
        "            calibrate(todo[0][0] if todo else rate)",
        "            calibrate(todo[0][0] if todo else None)",
        tests("tests/test_endpoint_predict.py",
              "test_the_server_idles_before_each_episode_as_the_next_points_arrivals_do"),
    ),
    Break(
        "endpoint calibration: decode episodes of 32 tokens whatever the workload",
        "benchbatch/core/endpoint_calibration.py",
        "    return max(MIN_DECODE_OUTPUT, min(DECODE_OUTPUT, median))",
        "    return DECODE_OUTPUT",
        SETTLE,
    ),
    Break(
        "prediction interval: measured and simulated requests drawn apart, not in pairs",
        "benchbatch/core/prediction.py",
        "    top, bottom = np.percentile(m[draw], q, axis=1), np.percentile(s[draw], q, axis=1)",
        "    top, bottom = np.percentile(m[draw], q, axis=1), np.percentile(s[draw[::-1]], q, "
        "axis=1)",
        tests("tests/test_prediction.py", "test_a_ratio_interval_resamples_requests_in_pairs"),
    ),
    Break(
        "prediction: the step-cost band only half as far on the slow side",
        "benchbatch/core/prediction.py",
        "    return tuple(float(f) for f in np.linspace(1 - spread, 1 + spread, n))",
        "    return tuple(float(f) for f in np.linspace(1 - spread, 1 + spread / 2, n))",
        tests("tests/test_prediction.py",
              "test_a_queue_amplifies_a_step_cost_error_as_worked_by_hand"),
    ),
    Break(
        "prediction: the band's median taken as the price's own value",
        "benchbatch/core/prediction.py",
        "            out[key] = float(statistics.median(known))",
        "            out[key] = float(known[0])",
        tests("tests/test_prediction.py",
              "test_a_prediction_across_a_static_groups_edge_is_the_bands_median_as_worked_by_hand",
              "test_the_bands_median_keeps_the_price_for_a_monotone_metric_and_skips_unknowns"),
    ),
    Break(
        "prediction: the band's median over the spread simulations without the price's",
        "benchbatch/core/prediction.py",
        "        known = [v for v in (at_price.get(key), *(s.get(key) for s in spread)) "
        "if _finite(v)]",
        "        known = [v for v in (*(s.get(key) for s in spread),) if _finite(v)] or "
        "[at_price.get(key)]",
        tests("tests/test_prediction.py",
              "test_the_bands_median_keeps_the_price_for_a_monotone_metric_and_skips_unknowns",
              "test_a_queue_amplifies_a_step_cost_error_as_worked_by_hand"),
    ),
    Break(
        "prediction: an interval left over the simulation at the price",
        "benchbatch/core/prediction.py",
        "                lo, hi = (lo * shift, hi * shift) if shift == shift else (lo, hi)",
        "                lo, hi = (lo, hi)",
        tests("tests/test_prediction.py",
              "test_an_interval_is_carried_from_the_simulation_at_the_price_to_the_prediction"),
    ),
    Break(
        "serve-sweep: sim_vs_real beside the simulation at the price, not the prediction",
        "benchbatch/experiments/serve/real.py",
        "    return probe.sim_vs_real(row, band_median(sim_row, spread, probe.COMPARED))",
        "    return probe.sim_vs_real(row, sim_row)",
        tests("tests/test_prediction.py",
              "test_sim_vs_real_sets_a_point_beside_its_bands_median"),
    ),
    Break(
        "serve-sweep: every real point predicted at the calibration's price, not the last "
        "one's speed",
        "benchbatch/experiments/serve/real.py",
        '        before = row["steps_over_price"] if row["steps_over_price"] > 0 else before',
        "        before = before",
        tests("tests/test_prediction.py",
              "test_serve_sweep_writes_prediction_from_the_sim_vs_real_pairs"),
    ),
    Break(
        "serve-sweep: a point at its own speed priced from the last point's speed too",
        "benchbatch/experiments/serve/real.py",
        '        served.at_speed[key] = at_speed(matched[key], w, capped, priced, '
        'row["steps_over_price"], n)',
        '        served.at_speed[key] = at_speed(matched[key], w, capped, model, '
        'row["steps_over_price"], n)',
        tests("tests/test_prediction.py",
              "test_serve_sweep_writes_prediction_from_the_sim_vs_real_pairs"),
    ),
    Break(
        "prediction: misses judged inside the band by the prediction, not the measurement",
        "benchbatch/core/prediction.py",
        '        inside = sum(r["simulated_low"] <= r["measured"] <= r["simulated_high"] '
        "for r in missed)",
        '        inside = sum(r["simulated_low"] <= r["simulated"] <= r["simulated_high"] '
        "for r in missed)",
        tests("tests/test_prediction.py",
              "test_the_step_cost_band_line_names_amplified_points_and_misses_it_accounts_for"),
    ),
    Break(
        "calibration: a masked key priced apart from a read one",
        "benchbatch/core/calibration.py",
        '    tied = any(r.get("masked_tokens") for r in rows)',
        '    tied = False',
        tests("tests/test_calibration.py",
              "test_a_static_groups_mostly_masked_step_is_priced_from_few_masked_keys"),
    ),
    Break(
        "burstiness: drawn arrivals always Poisson",
        "benchbatch/experiments/serve/workloads.py",
        "    unit = unit_poisson(n, seed, opts.burstiness)",
        "    unit = unit_poisson(n, seed)",
        tests("tests/test_serve.py", "test_bursty_arrivals_wait_longer_at_the_same_rate",
              "test_burstiness_applies_to_drawn_arrivals_and_not_to_a_traces_own"),
    ),
    Break(
        "burstiness: gamma gaps of the wrong scale (mean 1 / burstiness)",
        "benchbatch/core/arrivals.py",
        "        gaps = rng.gamma(burstiness, 1.0 / burstiness, requests)",
        "        gaps = rng.gamma(burstiness, 1.0, requests)",
        tests("tests/test_serving.py",
              "test_burstiness_draws_gamma_gaps_of_mean_one_and_vllms_spread"),
    ),
    Break(
        "client cap: the simulation beside an endpoint ignores --max-concurrency",
        "benchbatch/experiments/serve/endpoint.py",
        "        capped = replace(setup, client_limit=cap)  # the client's cap at this point",
        "        capped = replace(setup, client_limit=None)",
        tests("tests/test_endpoint_predict.py",
              "test_a_client_cap_is_simulated_as_the_client_held_the_requests"),
    ),
    Break(
        "client cap: the calibration's episodes held to --max-concurrency",
        "benchbatch/experiments/serve/predict.py",
        "            with stream(target, sent, np.asarray(times), opts) as run:",
        "            with stream(target, sent, np.asarray(times), opts, opts.caps[0]) as run:",
        tests("tests/test_endpoint_predict.py",
              "test_a_client_cap_is_simulated_as_the_client_held_the_requests"),
    ),
    # --- a concurrency sweep (--max-concurrency 1,2,4) ---
    Break(
        "concurrency sweep: every point streamed under the first cap",
        "benchbatch/experiments/serve/endpoint.py",
        "        with stream(rec.inputs[0], sent, arrivals, opts, cap) as run:",
        "        with stream(rec.inputs[0], sent, arrivals, opts, opts.caps[0]) as run:",
        tests("tests/test_concurrency_sweep.py"),
    ),
    Break(
        "concurrency sweep: a cap within the server's slots not below saturation",
        "benchbatch/experiments/serve/probe.py",
        '    held = cap is not None and cap <= matched.get("slots", 0)',
        '    held = cap is not None and cap < matched.get("slots", 0)',
        tests("tests/test_concurrency_sweep.py", "test_a_prediction_stands_beside_every_cap"),
    ),
    Break(
        "concurrency sweep: a point's intervals resampled from every cap's requests",
        "benchbatch/experiments/serve/endpoint.py",
        '              and r["rate"] == label and r["max_concurrency"] == cap}  # fmt: skip',
        '              and r["rate"] == label}  # fmt: skip',
        tests("tests/test_concurrency_sweep.py", "test_a_prediction_stands_beside_every_cap"),
    ),
    Break(
        "concurrency sweep: its rows not taken for one (slo.csv by rate)",
        "benchbatch/core/serving.py",
        "    return len({int(c) for c in caps if isinstance(c, int | float) and c == c}) > 1",
        "    return len({int(c) for c in caps if isinstance(c, int | float) and c == c}) > 99",
        tests("tests/test_concurrency_sweep.py"),
    ),
    Break(
        "client cap: a waiting request sent at its arrival, not when a slot freed",
        "benchbatch/core/arrivals.py",
        "            sent = max(arrived, heapq.heappop(self._free))",
        "            sent = arrived + 0 * heapq.heappop(self._free)",
        tests("tests/test_client_limit.py"),
    ),
    # --- the client's cap on benchbatch's own engine (serve-sweep --max-concurrency) ---
    Break(
        "engine cap: latencies counted from the arrival, not the sending",
        "benchbatch/runtime/engine.py",
        'sent = feed.arrival_s | getattr(feed, "sent_s", {})',
        "sent = feed.arrival_s",
        tests("tests/test_concurrency_sweep_engine.py"),
    ),
    Break(
        "engine cap: a client slot freed as the last step starts, not as it ends",
        "benchbatch/runtime/engine.py",
        "                feed.finish(state.finished, record.end_s)",
        "                feed.finish(state.finished, record.start_s)",
        tests("tests/test_concurrency_sweep_engine.py"),
    ),
    Break(
        "engine cap: the real engine's runs not held to the cap",
        "benchbatch/experiments/serve/probe.py",
        "                    client_limit=cap,",
        "                    client_limit=None,",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_the_real_engine_serves_each_cap_beside_its_simulation"),
    ),
    Break(
        "engine cap: the simulated sweep ignores each point's cap",
        "benchbatch/experiments/serve/run.py",
        "                capped, columns = probe.at_cap(setup, cap), probe.cap_columns(cap)",
        "                capped, columns = setup, probe.cap_columns(cap)",
        tests("tests/test_concurrency_sweep_engine.py"),
    ),
    Break(
        "engine cap: the simulation beside a real point ignores its cap",
        "benchbatch/experiments/serve/real.py",
        "        capped, columns = probe.at_cap(setup, cap), probe.cap_columns(cap)",
        "        capped, columns = setup, probe.cap_columns(cap)",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_the_real_engine_serves_each_cap_beside_its_simulation"),
    ),
    Break(
        "engine cap: one cap's real rates chosen without it",
        "benchbatch/experiments/serve/real.py",
        "        chosen = [(r, setup.client_limit) for r in chosen]",
        "        chosen = [(r, None) for r in chosen]",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_one_cap_holds_the_real_engine_at_the_rates_it_chose"),
    ),
    Break(
        "engine cap: the real caps chosen cheapest first, knees or not",
        "benchbatch/experiments/serve/rate_choice.py",
        "    order = [*knees, *rest]",
        "    order = sorted(cost_s, key=cost_s.get)",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_the_real_caps_are_the_knee_first_then_the_cheapest"),
    ),
    Break(
        "engine cap: a request's wait for a client slot not said",
        "benchbatch/experiments/serve/probe.py",
        '"queued_s": m.arrival - offered[m.request_id],',
        '"queued_s": 0.0,',
        tests("tests/test_concurrency_sweep_engine.py"),
    ),
    Break(
        "engine cap: a real point's intervals looked up without its cap",
        "benchbatch/experiments/serve/probe.py",
        "req/s{cap_label(r.get('max_concurrency'))}\"",
        "req/s\"",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_the_real_engine_serves_each_cap_beside_its_simulation"),
    ),
    Break(
        "engine cap: compare matches a concurrency sweep's points by rate alone",
        "benchbatch/output/compare_serve.py",
        "    if swept:  # each point its rate and cap: \"max, 4 in flight\"",
        "    if False:",
        tests("tests/test_concurrency_sweep_engine.py",
              "test_the_most_in_flight_within_the_slo_and_compare_by_cap"),
    ),
    # --- chat completions: the client's and the server's ---
    Break(
        "chat: the role's opening chunk counted as a token",
        "benchbatch/net/events.py",
        "            if role_only(delta, first):",
        "            if False:",
        tests("tests/test_client_chat.py",
              "test_chat_times_count_tokens_not_the_role_announcement"),
    ),
    Break(
        "chat: the rendered template tokenized with special tokens (a second BOS)",
        "benchbatch/net/completions.py",
        "    special = bool_field(body, \"add_special_tokens\", False)  # vLLM's chat default",
        "    special = bool_field(body, \"add_special_tokens\", True)",
        tests("tests/test_server_chat.py",
              "test_chat_prompts_are_transformers_and_tokens_the_engines"),
    ),
    Break(
        "chat: the template rendered without the assistant's turn opened",
        "benchbatch/net/completions.py",
        "    generation = bool_field(body, \"add_generation_prompt\", True)",
        "    generation = bool_field(body, \"add_generation_prompt\", False)",
        tests("tests/test_server_chat.py",
              "test_chat_prompts_are_transformers_and_tokens_the_engines"),
    ),
    Break(
        "at speed: every point's speed taken as the calibration's",
        "benchbatch/core/pricing.py",
        "    return spent / priced if priced > 0 else math.nan",
        "    return 1.0 if priced > 0 else math.nan",
        tests("tests/test_prediction.py",
              "test_a_points_speed_sums_its_steps_time_over_their_price"),
    ),
    Break(
        "at speed: the point simulated again at the calibration's speed",
        "benchbatch/experiments/serve/real.py",
        "    again = model.scaled(speed)",
        "    again = model",
        tests("tests/test_prediction.py",
              "test_serve_sweep_writes_prediction_from_the_sim_vs_real_pairs"),
    ),
    Break(
        "at speed: the wall clock's speed read where the CPU clock's is priced",
        "benchbatch/experiments/serve/real.py",
        "    seen, clock = 0, \"wall\" if cpu_cost is None else \"cpu\"",
        "    seen, clock = 0, \"wall\"",
        tests("tests/test_prediction.py",
              "test_serve_sweep_writes_prediction_from_the_sim_vs_real_pairs"),
    ),
    Break(
        "at speed: points far off their price warned about only past x0.7-1.43",
        "benchbatch/experiments/step_prices.py",
        "SPEED_MOVED = (0.8, 1.25)",
        "SPEED_MOVED = (0.7, 1.43)",
        tests("tests/test_prediction.py",
              "test_points_run_far_off_their_price_are_a_warning_naming_them"),
    ),
    Break(
        "at speed: values within counted as calibrated",
        "benchbatch/core/prediction.py",
        '<= r["ratio_at_speed"] <= r["target_high"] for r in judged)',
        '<= r["ratio"] <= r["target_high"] for r in judged)',
        tests("tests/test_prediction.py",
              "test_the_at_speed_line_counts_values_within_at_each_points_own_speed"),
    ),
    Break(
        "audit: a streamed table's first write through pandas",
        "benchbatch/output/run_folder.py",
        "            csv_rows.write_csv_plain(path, rows, columns)",
        "            results.write_csv(path, rows)",
        tests("tests/test_reliability.py", "test_streaming_rows_never_imports_pandas"),
    ),
    Break(
        "audit: a chunk whose choices is no list read as one",
        "benchbatch/net/events.py",
        "    if choices is not None and not isinstance(choices, list):",
        "    if False:",
        tests("tests/test_client.py",
              "test_every_failure_is_counted_in_its_kind_and_the_served_are_kept"),
    ),
    Break(
        "audit: a probe never answered left to every request's timeout",
        "benchbatch/net/discovery.py",
        '        raise NoAnswer(f"no answer within {endpoint.timeout_s:g} s") from None',
        '        return None, "timed out"',
        tests("tests/test_client.py",
              "test_a_probe_taken_and_never_answered_is_one_line_before_the_run"),
    ),
    Break(
        "audit: the serving figure's TPOT axis topped by the points alone",
        "benchbatch/output/plots/serve.py",
        "    top = float(np.nanmax(np.append(tpots, slo_tpot))) * 1e3",
        "    top = max(np.nanmax(tpots), slo_tpot) * 1e3",
        tests("tests/test_serve_endpoint.py",
              "test_a_server_that_fails_every_request_is_counted_and_drawn",
              "test_one_token_outputs_have_no_tpot_and_are_drawn"),
    ),
    Break(
        "audit: fields that change the output left out, not refused",
        "benchbatch/net/completions.py",
        "    for name in UNSERVED:",
        "    for name in ():",
        tests("tests/test_server.py", "test_bad_requests_get_openai_errors"),
    ),
    Break(
        "audit: CPU ranks each counting the machine's whole RAM",
        "benchbatch/runtime/device.py",
        "        free //= ranks.local_world_size()",
        "        free //= 1",
        tests("tests/test_tensor_parallel.py", "test_cpu_ranks_on_one_machine_share_its_ram"),
    ),
    Break(
        "audit: a paged block longer than the context taken",
        "benchbatch/experiments/fields.py",
        "        kv_layout != \"paged\" or block_size <= cfg.max_context,",
        "        True,",
        tests("tests/test_memory_cli.py",
              "test_a_paged_block_longer_than_the_context_is_refused"),
    ),
    Break(
        "audit 2: the total-token throughput on the workload's prompts",
        "benchbatch/experiments/serve/endpoint_rows.py",
        "    row = probe.point_row(p, setup, prompts)",
        "    row = probe.point_row(p, setup)",
        tests("tests/test_peers.py",
              "test_total_token_throughput_counts_the_servers_prompt_tokens_as_vllm"),
    ),
    Break(
        "audit 2: a reused CPU-clock fit pricing a wall-clock run",
        "benchbatch/experiments/ablation/run.py",
        "        on_cpu = net is None or (rec.meta.get(\"threads\") or {}).get(\"clock\") == "
        "\"cpu\"",
        "        on_cpu = True",
        tests("tests/test_calibration_conditions.py",
              "test_a_reused_cpu_clock_fit_prices_only_a_run_on_the_cpu_clock"),
    ),
    Break(
        "audit 2: the calibration run in the contiguous cache whatever the layout",
        "benchbatch/runtime/calibrate.py",
        "    kv = dict(layout or {})\n    woken =",
        "    kv = {}\n    woken =",
        tests("tests/test_calibration_conditions.py",
              "test_the_calibration_runs_in_the_cache_layout_it_prices"),
    ),
    Break(
        "audit 2: the model's shape not compared",
        "benchbatch/core/saved_calibration.py",
        "           \"model\", \"weight_layout\", \"compiled\", \"kv_layout\")",
        "           \"weight_layout\", \"compiled\", \"kv_layout\")",
        tests("tests/test_calibration_conditions.py",
              "test_the_shape_layouts_and_compile_are_flagged_by_name"),
    ),
    Break(
        "audit 2: a run whose result.json failed left marked complete",
        "benchbatch/output/run_folder.py",
        "                self.meta.update(status=\"failed\", error=f\"{type(e).__name__}: {e}\")",
        "                pass",
        tests("tests/test_results_integrity.py",
              "test_a_disk_full_at_the_end_never_leaves_a_complete_marker"),
    ),
    Break(
        "audit 2: a body past the context parsed on the event loop",
        "benchbatch/net/server.py",
        "    return min(MAX_BODY_BYTES, max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_model_len))",
        "    return MAX_BODY_BYTES",
        tests("tests/test_server.py", "test_bad_requests_get_openai_errors"),
    ),
    Break(
        "audit 2: a folder with a single file beside an index served the shards",
        "benchbatch/runtime/checkpoint.py",
        "    if index.is_file() and (p / \"model.safetensors\").is_file():",
        "    if False:",
        tests("tests/test_checkpoint.py", "test_a_single_file_beside_an_index_is_refused"),
    ),
    Break(
        "audit 3: occupancy's run simulated again at the calibration's speed",
        "benchbatch/experiments/occupancy/real.py",
        "        again = _simulated(requests, policy, slots, model.scaled(speeds[policy])) \\",
        "        again = _simulated(requests, policy, slots, model) \\",
        tests("tests/test_occupancy_cli.py", "test_real_engine_measures_both_policies"),
    ),
    Break(
        "audit 3: occupancy's runs' speed read on the wall clock where the CPU's prices",
        "benchbatch/experiments/occupancy/real.py",
        "    clock = \"wall\" if cpu_cost is None else \"cpu\"",
        "    clock = \"wall\"",
        tests("tests/test_occupancy_cli.py", "test_real_engine_measures_both_policies"),
    ),
    Break(
        "audit 3: occupancy's wall time judged again at its own speed (x1 by definition)",
        "benchbatch/experiments/occupancy/real.py",
        "            if pair[\"metric\"] == \"wall_s\":",
        "            if False:",
        tests("tests/test_occupancy_cli.py", "test_real_engine_measures_both_policies"),
    ),
    Break(
        "audit 3: ablation's scheme simulated again at the calibration's speed",
        "benchbatch/experiments/ablation/run.py",
        "        sim = probe.simulate_scheme(requests, scheme, budgets, cost.scaled(factor))",
        "        sim = probe.simulate_scheme(requests, scheme, budgets, cost)",
        tests("tests/test_ablation.py", "test_real_engine_run_writes_every_file"),
    ),
    Break(
        "audit 3: ablation's steps priced by another scheme's",
        "benchbatch/experiments/ablation/run.py",
        "    speeds = {s: speed([r for r in steps if r[\"scheme\"] == s]) for s in schemes}",
        "    speeds = {s: speed(steps) for s in schemes}",
        tests("tests/test_ablation.py", "test_real_engine_run_writes_every_file"),
    ),
    Break(
        "audit 3: compare's phases steps by label alone, whatever their context",
        "benchbatch/output/compare.py",
        "    if len(contexts) <= 1:\n        return df.assign(step=df[\"label\"])",
        "    if True:\n        return df.assign(step=df[\"label\"])",
        tests("tests/test_compare.py",
              "test_decodes_at_other_contexts_are_never_one_row_or_one_ratio"),
    ),
    Break(
        "audit 3: a CSV's last line cut short read as a row",
        "benchbatch/core/inputs.py",
        "    if len(last) < len(header) or (len(last) == len(header) and unended):",
        "    if False:",
        tests("tests/test_compare.py", "test_a_table_cut_short_is_refused"),
    ),
    Break(
        "audit 3: the KV room beside the whole model's weights under tensor parallelism",
        "benchbatch/core/kvceiling.py",
        "    weights = accounting.weight_bytes(cfg, dtype, tp)",
        "    weights = accounting.weight_bytes(cfg, dtype)",
        tests("tests/test_kvceiling.py",
              "test_under_tensor_parallelism_each_rank_holds_its_shard_and_its_share_of_the_kv"),
    ),
    Break(
        "audit 3: a probe timed once taken as steady",
        "benchbatch/output/ceilings_cache.py",
        "    return repeats is not None and repeats < 2",
        "    return False",
        tests("tests/test_ceilings_cache_noisy.py",
              "test_a_probe_timed_once_is_not_kept_and_its_noise_is_unknown"),
    ),
    Break(
        "audit 4: the served text's stream not primed with the prompt",
        "benchbatch/net/completions.py",
        "        return DecodeStream(ids=ids, skip_special_tokens=self.skip)",
        "        return DecodeStream(skip_special_tokens=self.skip)",
        tests("tests/test_server.py",
              "test_a_streams_text_continues_its_prompt_as_one_decoding_of_both"),
    ),
    Break(
        "audit 4: the stop token that ended a request written in its text",
        "benchbatch/net/completions.py",
        "        return \"\".join(self._step(t) for t in list(ids[:-1] if stopped else ids))",
        "        return \"\".join(self._step(t) for t in list(ids))",
        tests("tests/test_server.py",
              "test_the_stop_token_that_ended_a_request_is_not_in_its_text"),
    ),
    Break(
        "audit 4: continuous_usage_stats ignored",
        "benchbatch/net/server.py",
        "            return {\"usage\": _usage(ask, n)}",
        "            return {\"usage\": None}",
        tests("tests/test_server.py",
              "test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk"),
    ),
    Break(
        "audit 4: response ids restart with each server",
        "benchbatch/net/server.py",
        "    head = _Head(f\"{s.run}-{live.id}\", int(time.time()), s.name, chat)",
        "    head = _Head(str(live.id), int(time.time()), s.name, chat)",
        tests("tests/test_server.py", "test_response_ids_are_the_servers_and_the_requests"),
    ),
    Break(
        "audit 4: a later options group's field recorded over the command's own",
        "benchbatch/core/optkit.py",
        "            out.setdefault(k, _plain(v))",
        "            out[k] = _plain(v)",
        tests("tests/test_projection.py", "test_the_options_project_takes_are_recorded_as_given"),
    ),
    Break(
        "audit 4: a probe.csv's all-reduce row priced unchecked",
        "benchbatch/core/projection.py",
        "        if size <= 0 or not all(math.isfinite(v) and v > 0 for v in (ms, gbps)):",
        "        if False:",
        tests("tests/test_projection.py",
              "test_a_probe_csvs_bad_all_reduce_row_is_one_line_naming_ceilings"),
    ),
    Break(
        "audit 4: a GPU of unknown memory said to fit",
        "benchbatch/core/projection.py",
        "        \"fits\": None if most is None else batch <= most,",
        "        \"fits\": most is None or batch <= most,",
        tests("tests/test_projection.py", "test_a_gpu_of_unknown_memory_fits_unknown_not_yes"),
    ),
    Break(
        "audit 4: table B's decodes at any context, the verdicts' at the smallest",
        "benchbatch/output/report/sections.py",
        "                and (phase == \"prefill\" or int(r[\"context\"]) == context)]",
        "                and (phase == \"prefill\" or True)]",
        tests("tests/test_report.py",
              "test_table_b_reads_its_decodes_at_the_context_its_verdicts_compare"),
    ),
    Break(
        "audit 4: a real speedup of the same work judged as measured",
        "benchbatch/output/report/claims.py",
        "            judged = 1.0",
        "            judged = speedup",
        tests("tests/test_report.py", "test_a_real_speedup_of_the_same_work_is_judged_1x"),
    ),
    Break(
        "audit 4: occupancy's runs of the same work never said to be",
        "benchbatch/core/noise.py",
        "    return steps[0] == steps[1] and abs(used[0] - used[1]) <= 0.005",
        "    return False",
        tests("tests/test_occupancy_cli.py",
              "test_the_engine_line_says_a_wall_time_gain_of_the_same_work_is_the_devices"),
    ),
    Break(
        "audit 4: the calibration's outputs staggered past the context",
        "benchbatch/runtime/calibrate.py",
        "    k = max(1, min(p.decode_steps, (room - 1) // p.slots))",
        "    k = p.decode_steps",
        tests("tests/test_calibration.py",
              "test_the_calibrations_requests_fit_the_context_at_any_slot_count"),
    ),
    Break(
        "audit 4: the tables compare leaves out left unsaid",
        "benchbatch/experiments/compare/run.py",
        "    return sorted(held - read)",
        "    return []",
        tests("tests/test_compare.py", "test_the_tables_compare_does_not_read_are_named"),
    ),
    Break(
        "audit 4: a warning about a finished table never said",
        "benchbatch/output/recorder.py",
        "            if later:\n                self.later.append(text)",
        "            if later:\n                pass",
        tests("tests/test_calibration_conditions.py",
              "test_a_warning_about_a_finished_table_is_kept_now_and_said_under_it"),
    ),
    Break(
        "audit 5: an integral float max_tokens refused (vLLM's pydantic takes 5.0)",
        'benchbatch/net/lax.py',
        '        if math.isfinite(value) and value == int(value):',
        '        if False:',
        tests("tests/test_server_lax.py", "test_fields_read_as_vllms_pydantic_reads_them"),
    ),
    Break(
        'audit 5: a completion body of another media type served',
        'benchbatch/net/server.py',
        '    if request.headers.get("Content-Type", "").split(";")[0].strip().lower() != "application/json":',  # noqa: E501
        '    if False:',
        tests("tests/test_server_lax.py",
              "test_a_completion_not_sent_as_json_is_refused_as_vllm_does"),
    ),
    Break(
        "audit 5: an endpoint point's rates over its served requests alone",
        'benchbatch/experiments/serve/probe.py',
        '        **throughput_columns(p.metrics, prompts, setup.slo, p.span_s),',
        '        **throughput_columns(p.metrics, prompts, setup.slo),',
        tests("tests/test_serve_endpoint.py", "test_the_rows_count_what_the_server_did",
              "test_a_server_that_fails_every_request_is_counted_and_drawn"),
    ),
    Break(
        'audit 5: a stream the server aborted counted served',
        'benchbatch/net/events.py',
        '        if rec.finish_reason in CUT_SHORT:',
        '        if False:',
        tests("tests/test_client.py",
              "test_every_failure_is_counted_in_its_kind_and_the_served_are_kept"),
    ),
    Break(
        'audit 5: the requests out at Ctrl-C left out of requests.csv',
        'benchbatch/experiments/serve/endpoint.py',
        '                    if s.posted:',
        '                    if False:',
        tests("tests/test_serve_endpoint.py", "test_requests_out_at_ctrl_c_keep_their_rows"),
    ),
    Break(
        'audit 5: a step timed once called steady',
        'benchbatch/runtime/timing.py',
        '        return self.repeats < 2 or self.cv > self.cv_threshold',
        '        return self.cv > self.cv_threshold',
        tests("tests/test_timing.py", "test_percentiles_interpolate_between_repeats"),
    ),
    Break(
        "audit 5: a reservation counted past the model's context",
        'benchbatch/core/kvceiling.py',
        '    reserved = min(most, max(prompts) + reserve_output)',
        '    reserved = max(prompts) + reserve_output',
        tests("tests/test_kvceiling.py", "test_no_sequence_is_counted_past_the_models_context"),
    ),
    Break(
        'audit 5: --ceilings taken with --no-roofline',
        'benchbatch/core/options.py',
        '        if self.ceilings is not None:  # the file would win over --no-roofline, unsaid',
        '        if False:',
        tests("tests/test_sweep.py", "test_ceilings_with_no_roofline_are_refused"),
    ),
    Break(
        'audit 5: a probe.csv of other conditions used unsaid',
        'benchbatch/experiments/ceilings.py',
        '        rec.warning(given_conditions(rec, run.ceilings))',
        '        pass',
        tests("tests/test_phases_cli.py",
              "test_ceilings_measured_under_other_conditions_are_flagged"),
    ),
    Break(
        "audit 5: a cell past csv's field limit a traceback",
        'benchbatch/core/inputs.py',
        "    except csv.Error:  # a field past csv's limit",
        "    except KeyError:  # a field past csv's limit",
        tests("tests/test_calibration_inputs.py",
              "test_a_field_past_csvs_limit_is_refused_not_a_traceback"),
    ),
    Break(
        'audit 5: an empty path read as the current folder',
        'benchbatch/app/params.py',
        '    if isinstance(value, str) and not value.strip():',
        '    if False:',
        tests("tests/test_hostile_input.py", "test_an_empty_out_is_refused_not_the_current_folder"),
    ),
    Break(
        "audit 5: a slow dtype's probe sizes kept",
        'benchbatch/runtime/ceilings.py',
        '        while n > SMALLEST and call_s * (n / SMALLEST) ** 3 > MAX_CALL_S:',
        '        while False:',
        tests("tests/test_probe.py", "test_a_slow_dtypes_products_are_sized_to_finish"),
    ),
    Break(
        'audit 5: a number folded across lines',
        'benchbatch/output/render.py',
        '                         overflow="fold", min_width=least or None)  # fmt: skip',
        '                         overflow="fold")  # fmt: skip',
        tests("tests/test_figures.py",
              "test_a_number_or_a_headers_word_is_never_split_across_lines"),
    ),
    Break(
        'audit 5: an interrupted sweep keeps no summary',
        'benchbatch/experiments/sweep/run.py',
        '            _interrupted_summary(rec, net.cfg, opts, ceiling, ridge, ridge_source)',
        '            pass',
        tests("tests/test_sweep.py", "test_ctrl_c_keeps_the_summary_of_the_contexts_it_finished"),
    ),
    Break(
        "audit 5: a CPU's probe.csv priced as a GPU's unsaid",
        'benchbatch/experiments/project/options.py',
        '        if not cpu and min(shares) >= FOREIGN_SHARE:',
        '        if True:',
        tests("tests/test_projection.py", "test_a_probe_csv_from_another_device_is_flagged"),
    ),
    Break(
        "audit 5: a range's whole-number ends read as missing",
        'benchbatch/output/compare_serve.py',
        '    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)',  # noqa: E501
        '    if not all(isinstance(v, float) and not isinstance(v, bool) and math.isfinite(v)',
        tests("tests/test_compare_rates.py", "test_ranges_overlap_at_a_shared_end_and_not_past_it"),
    ),
    Break(
        'audit 5: a malformed bracketed --endpoint host a traceback',
        'benchbatch/net/endpoint.py',
        '    except ValueError as e:  # the text not echoed: it may hold credentials',
        '    except KeyError as e:  # the text not echoed: it may hold credentials',
        tests("tests/test_client.py", "test_bad_urls_are_one_line_naming_the_option"),
    ),
    Break(
        "audit 5: phases' noisy steps named without their context",
        'benchbatch/experiments/phases/run.py',
        '    if len(contexts) < 2:',
        '    if True:',
        tests("tests/test_phases_cli.py",
              "test_noisy_steps_are_named_with_their_context_when_there_are_several"),
    ),
    Break(
        "audit 6: a knee without a ridge always blamed on the device",
        'benchbatch/experiments/sweep/probe.py',
        '        return RooflineKnee(None, None, limit, False, f"no prediction ({no_ridge})")',
        '        return RooflineKnee(None, None, limit, False, "no prediction (unknown device)")',
        tests("tests/test_sweep.py", "test_ctrl_c_keeps_the_summary_of_the_contexts_it_finished"),
    ),
    Break(
        "audit 6: sweep takes a prompt past the model's context",
        'benchbatch/experiments/sweep/run.py',
        '        check_prompt_fits(cfg.max_context, requests, length_options(workload, requests)[0])',  # noqa: E501
        '        pass',
        tests("tests/test_sweep.py"),
    ),
    Break(
        "audit 6: /detokenize drops special tokens",
        'benchbatch/net/tokenize.py',
        'skip_special_tokens=False',
        'skip_special_tokens=True',
        tests("tests/test_server_tokenize.py"),
    ),
    Break(
        "audit 6: /tokenize's token strings are each id's text",
        'benchbatch/net/tokenize.py',
        'strs = [served.tokenizer.id_to_token(i) for i in ids]',
        'strs = [served.tokenizer.decode([i]) for i in ids]',
        tests("tests/test_server_tokenize.py"),
    ),
    Break(
        "audit 6: a chat prompt tokenized with the tokenizer's BOS",
        'benchbatch/net/completions.py',
        '    special = bool_field(body, "add_special_tokens", False)  # vLLM\'s chat default',
        '    special = bool_field(body, "add_special_tokens", True)  # vLLM\'s chat default',
        tests("tests/test_server_tokenize.py"),
    ),
    Break(
        "audit 6: the packed probe multiplies by b's transpose",
        'benchbatch/runtime/ceilings.py',
        '            w = layout.pack(b.t())',
        '            w = layout.pack(b)',
        tests("tests/test_probe.py", "test_a_packed_matmul_probe_computes_the_same_product"),
    ),
    Break(
        "audit 6: the packed candidate never timed",
        'benchbatch/runtime/layout.py',
        '    return LAYOUTS + ((PACKED,) if packed and packable(device, dtype) else ())',
        '    return LAYOUTS',
        tests("tests/test_layout.py"),
    ),
    Break(
        "audit 6: a packed model compiled as it is",
        'benchbatch/runtime/compiled.py',
        '    if model.layout.packed:',
        '    if False:',
        tests("tests/test_layout.py", "test_compiling_a_packed_model_lays_it_out_strided"),
    ),
    Break(
        "audit 6: a tied head packed apart from its embedding",
        'benchbatch/runtime/layout.py',
        '            if packed and isinstance(child, nn.Linear) and child is not keep:',
        '            if packed and isinstance(child, nn.Linear):',
        tests("tests/test_layout.py"),
    ),
    Break(
        "audit 6: the probe plans no packed matmul",
        'benchbatch/runtime/ceilings.py',
        '    return plan(matmuls, buffer, packs(target.device, target.dtype_name))',
        '    return plan(matmuls, buffer)',
        tests("tests/test_probe.py"),
    ),
    Break(
        "audit 6: compare says nothing of another weight layout",
        'benchbatch/output/compare.py',
        '    if len(set(layouts)) > 1:  # packed against strided: up to 1.6x a step on one CPU',
        '    if False:',
        tests("tests/test_compare.py", "test_what_the_runs_measured_differently_is_said"),
    ),
    Break(
        "audit 7: a packed product under its floor not padded",
        'benchbatch/runtime/layout.py',
        '    if 0 < rows < floor:',
        '    if False:',
        tests("tests/test_layout.py", "test_a_packed_product_under_its_floor_is_the_product"),
    ),
    Break(
        "audit 7: the padded rows' outputs kept",
        'benchbatch/runtime/layout.py',
        '        return out[:rows].reshape(*x.shape[:-1], out.shape[-1])',
        '        return out',
        tests("tests/test_layout.py", "test_a_packed_product_under_its_floor_is_the_product"),
    ),
    Break(
        "audit 7: the floor the fastest row count, not the fewest near it",
        'benchbatch/runtime/layout.py',
        '    best = next(i for i, t in enumerate(times) if t <= (1 + FLOOR_TIE) * fastest)',
        '    best = times.index(fastest)',
        tests("tests/test_layout.py", "test_the_floor_is_the_fewest_rows_near_the_fastest"),
    ),
    Break(
        "audit 7: a floor kept however little it gains",
        'benchbatch/runtime/layout.py',
        '    return FLOOR_ROWS[best] if times[best] < (1 - FLOOR_GAIN) * times[0] else 1',
        '    return FLOOR_ROWS[best]',
        tests("tests/test_layout.py", "test_the_floor_is_the_fewest_rows_near_the_fastest"),
    ),
    Break(
        "audit 7: the packed candidate timed without its floor",
        'benchbatch/runtime/layout.py',
        '        if PACKED in layouts:  # timed and chosen at its floor',
        '        if False:',
        tests("tests/test_layout.py",
              "test_packed_is_chosen_where_it_scores_least_and_never_for_compile"),
    ),
    Break(
        "audit 7: a new floor not given to products already packed",
        'benchbatch/runtime/layout.py',
        '                child.floor = floor',
        '                pass',
        tests("tests/test_layout.py", "test_a_floor_laid_out_reaches_every_packed_product"),
    ),
    Break(
        "audit 7: serve-sweep prices each step between the engine's steps",
        'benchbatch/experiments/serve/real.py',
        '    events = _priced_if_cut(rec, engine_events(net, requests, runs, seed), cost, '
        'cpu_cost)',
        '    from benchbatch.experiments.step_prices import priced\n'
        '    events = (priced([e], cost, cpu_cost).__next__() if isinstance(e, dict) else e\n'
        '              for e in engine_events(net, requests, runs, seed))',
        tests("tests/test_calibration.py",
              "test_serve_sweep_prices_its_steps_after_each_point_not_between_steps"),
    ),
    Break(
        "audit 7: an interrupted point's kept steps left unpriced",
        'benchbatch/experiments/serve/real.py',
        '        price_in_place(unpriced, cost, cpu_cost)',
        '        pass',
        tests("tests/test_calibration.py", "test_an_interrupted_serve_sweep_prices_what_it_kept"),
    ),
    Break(
        "audit 8: the timed simulation charges no wake after an idle wait",
        'benchbatch/core/simulate.py',
        '        now += step_cost(plan) + (woken(idle) if woken is not None and idle else 0.0)',
        '        now += step_cost(plan)',
        tests("tests/test_wake.py",
              "test_the_timed_simulation_charges_the_wake_to_the_first_step_after_each_wait"),
    ),
    Break(
        "audit 8: the wake charged to every step after a wait, not the first",
        'benchbatch/core/simulate.py',
        '        idle = 0.0\n',
        '',
        tests("tests/test_wake.py",
              "test_the_timed_simulation_charges_the_wake_to_the_first_step_after_each_wait"),
    ),
    Break(
        "audit 8: a wait past the cap priced in full",
        'benchbatch/core/step_model.py',
        '    return min(idle_s, WAKE_CAP_S) ** power',
        '    return idle_s ** power',
        tests("tests/test_wake.py",
              "test_the_timed_simulation_charges_the_wake_to_the_first_step_after_each_wait"),
    ),
    Break(
        "audit 8: scaling a model scales its wake's exponent too",
        'benchbatch/core/step_model.py',
        'kept = ("settle_decay", "row_block", "wake_power")',
        'kept = ("settle_decay", "row_block")',
        tests("tests/test_wake.py", "test_a_real_steps_price_adds_the_wake_after_a_wait"),
    ),
    Break(
        "audit 8: a wait shorter than the calibration's shortest priced by the power law",
        'benchbatch/core/step_model.py',
        '    if idle_s < WAKE_MIN_S:',
        '    if False:',
        tests("tests/test_wake.py",
              "test_a_wait_shorter_than_the_calibrations_shortest_is_priced_in_proportion"),
    ),
    Break(
        "audit 8: a real step's price without its wake",
        'benchbatch/core/pricing.py',
        '    woken = model.woken_s(idle_s(row))',
        '    woken = 0.0',
        tests("tests/test_wake.py", "test_a_real_steps_price_adds_the_wake_after_a_wait"),
    ),
    Break(
        "audit 8: the woken steps kept in the steady fit",
        'benchbatch/core/calibration.py',
        '    rows, woken = wake.split(rows)',
        '    _, woken = wake.split(rows)',
        tests("tests/test_wake.py",
              "test_the_steady_fit_is_the_same_with_or_without_the_woken_steps"),
    ),
    Break(
        "audit 8: the wake's exponent not tried",
        'benchbatch/core/wake.py',
        '        f = np.array([wake_shape(w, power) for w in waits])',
        '        f = np.array([wake_shape(w, 0.5) for w in waits])',
        tests("tests/test_wake.py", "test_the_fit_recovers_a_synthetic_engines_wake_exactly"),
    ),
    Break(
        "audit 8: a saved calibration read without its wake",
        'benchbatch/core/saved_calibration.py',
        '    return replace(model, wake_s=ms / 1e3, wake_power=float(power))',
        '    return model',
        tests("tests/test_wake.py", "test_a_saved_calibration_keeps_its_wake"),
    ),
    Break(
        "audit 8: the engine records no wait before a step",
        'benchbatch/runtime/engine.py',
        '                record = replace(record, idle_s=idle)',
        '                pass',
        tests("tests/test_wake.py", "test_the_engine_records_the_wait_before_a_step"),
    ),
    Break(
        "audit 8: serve-sweep's calibration without its wake runs",
        'benchbatch/experiments/serve/run.py',
        'cpu_clock=True, wake=True)',
        'cpu_clock=True)',
        tests("tests/test_calibration.py",
              "test_serve_sweep_prices_its_steps_after_each_point_not_between_steps"),
    ),
]


# --- running ---------------------------------------------------------------------------------


def repo_files(root: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore: what a fresh checkout holds."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (root / name).is_file()]


def copy_repo(root: Path, dest: Path) -> None:
    for name in repo_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)


def status_of(base: Path, brk: Break) -> str | None:
    """None if the break applies; else why it is stale."""
    path = base / brk.path
    if not path.is_file():
        return f"{brk.path} does not exist"
    count = path.read_text(encoding="utf-8").count(brk.find)
    if count != 1:
        where = "not found" if count == 0 else f"found {count} times"
        return f"text {where} in {brk.path}: {brk.find!r}"
    return None


def run_tests(copy: Path, targets: tuple[str, ...], timeout: float) -> tuple[int, str]:
    """pytest on the copy, stopping at the first failure: (exit code, first failure)."""
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider"]
    try:
        proc = subprocess.run(
            [*command, *targets], cwd=copy, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    failed = [ln for ln in proc.stdout.splitlines() if re.match(r"(FAILED|ERROR) ", ln)]
    return proc.returncode, (failed[0][:150] if failed else proc.stdout.strip()[-300:])


def try_break(base: Path, work: Path, brk: Break, timeout: float) -> tuple[str, str]:
    """('caught' | 'SURVIVED' | 'ERROR', detail), the break applied to a fresh copy."""
    copy = Path(tempfile.mkdtemp(dir=work))
    try:
        shutil.copytree(base, copy, dirs_exist_ok=True)
        path = copy / brk.path
        path.write_text(path.read_text(encoding="utf-8").replace(brk.find, brk.replace))
        code, detail = run_tests(copy, brk.tests, timeout)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    if code == 0:
        return "SURVIVED", "every test passed"
    if code == 1:
        return "caught", detail
    return "ERROR", f"pytest exit code {code}: {detail}"  # not a failing test: fix the break


def baseline(base: Path, breaks: list[Break], timeout: float) -> bool:
    targets = tuple(dict.fromkeys(t for b in breaks for t in b.tests))
    started = time.monotonic()
    code, detail = run_tests(base, targets, timeout)
    print(f"baseline ({len(targets)} test targets, {time.monotonic() - started:.0f} s): ", end="")
    print("pass" if code == 0 else f"FAILS ({detail})", flush=True)
    return code == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", default="", help="only breaks whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the breaks, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="breaks tried at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per pytest run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unbroken run")
    args = parser.parse_args(argv)
    breaks = [b for b in BREAKS if args.k.lower() in b.name.lower()]
    if args.list:
        for b in breaks:
            files = dict.fromkeys(t.split("::")[0] for t in b.tests)
            print(f"{b.name}\n    {b.path} -> {len(b.tests)} targets in {', '.join(files)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="benchbatch-mutations-") as tmp:
        base, work = Path(tmp) / "repo", Path(tmp) / "work"
        copy_repo(ROOT, base)
        work.mkdir()
        return check(base, work, breaks, args)


def check(base: Path, work: Path, breaks: list[Break], args) -> int:
    stale = {b.name: why for b in breaks if (why := status_of(base, b))}
    for name, why in stale.items():
        print(f"STALE     {name}: {why}", flush=True)
    live = [b for b in breaks if b.name not in stale]
    if not args.no_baseline and not baseline(base, live, args.timeout):
        return 2
    started = time.monotonic()

    def one(brk: Break) -> tuple[str, str]:
        verdict, detail = try_break(base, work, brk, args.timeout)
        print(f"{verdict:<9} {brk.name}: {detail}", flush=True)
        return verdict, detail

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        verdicts = [v for v, _ in pool.map(one, live)]
    survived = verdicts.count("SURVIVED") + verdicts.count("ERROR")
    elapsed = time.monotonic() - started
    if survived or stale:
        print(f"{len(breaks)} breaks: {survived} survived, {len(stale)} stale ({elapsed:.0f} s)")
        return 1
    print(f"{len(breaks)} breaks, all caught ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
