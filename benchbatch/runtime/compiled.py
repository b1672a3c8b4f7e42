"""--compile: the model's step through torch.compile, compile time kept apart, eager on failure.

What is compiled is Transformer._run, the whole forward of a step (embedding to logits, every
layer, the KV-cache writes and reads): the small operations between the matmuls (norms,
rotary, SiLU * up, residual adds) fuse into a few kernels. On a CPU that is inductor's
default mode (C++ kernels, built by the machine's compiler). On CUDA it is mode
"reduce-overhead" (inductor's CUDA graphs, as gpt-fast does), unless benchbatch replays the
step from its own CUDA graph (--cuda-graphs), which then captures the compiled kernels.

Shapes: the first shape of a step compiles static; a new one recompiles once with dynamic
sizes (torch's default), after which batch sizes and KV lengths reuse that graph. The
seconds of every call during which torch compiled something are summed in `compile_s`, so a
table can show them beside the step time instead of inside it.

A failure to compile (torch.compile itself, or a first call that fails inside the compiler,
e.g. no C++ compiler) falls back to the eager step: `on_fallback` gets one line saying why,
`state.fallback` keeps it, and the run goes on eagerly.

What ran is recorded, not what was asked. Inductor's "reduce-overhead" skips its CUDA
graphs for a function that mutates inputs made in eager code (the step's KV-cache writes
do: "skipping cudagraphs due to mutated inputs"), bumping counters["inductor"]
["cudagraph_skips"] and logging the reason on its "cudagraphs" artifact logger; the state
keeps both, and `ran` says the step ran inductor's kernels without CUDA graphs (the mode
that does capture them is benchbatch's own graph around the compiled step: --cuda-graphs).
Dynamo recompiles a function at most torch._dynamo.config.recompile_limit (8) times, then
runs it as plain Python: such calls are counted (`eager_calls`) as they happen, from
inside the function (torch.compiler.is_compiling() is False only when nothing traced it).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class CompileState:
    """What --compile did to a model: for metadata.json and the tables."""

    mode: str
    applied: bool = True  # False once it fell back to eager
    fallback: str | None = None
    compile_s: float = 0.0
    graphs: int = 0
    cudagraph_skips: int = 0  # graphs inductor compiled without its CUDA graphs
    skip_reasons: list[str] = field(default_factory=list)  # inductor's words, each once
    eager_calls: int = 0  # calls dynamo ran as plain Python (past its recompile limit)
    info: dict = field(default_factory=dict, repr=False)  # to_dict's, kept current

    def __post_init__(self) -> None:
        self.sync()

    def sync(self) -> None:
        """Bring `info` up to date (metadata.json holds that very dict)."""
        self.info.update(self.to_dict())

    def to_dict(self) -> dict:
        return {
            "requested": True,
            "applied": "torch.compile" if self.applied else "eager (fallback)",
            "mode": self.mode,
            "fallback": self.fallback,
            "compile_s": self.compile_s,
            "graphs": self.graphs,
            "ran": self.ran,
            "cudagraph_skips": self.cudagraph_skips,
            "cudagraph_skip_reasons": list(self.skip_reasons),
            "eager_calls": self.eager_calls,
            "recompile_limit": _recompile_limit(),
        }

    @property
    def ran(self) -> str:
        """What the compiled steps ran as, in a few words (calls dynamo ran eagerly past
        its recompile limit are counted apart: eager_calls, and each row's `eager`)."""
        if not self.applied:
            return "eager (fallback)"
        kernels = "inductor kernels"
        if self.mode == "reduce-overhead":
            if self.cudagraph_skips:
                kernels += " without CUDA graphs (inductor skipped them; --cuda-graphs captures)"
            elif self.graphs:
                kernels += " in inductor's CUDA graphs"
        return kernels

    def counts(self) -> dict:
        """The running totals a row's deltas come from (see row_columns)."""
        names = ("compile_s", "graphs", "eager_calls", "cudagraph_skips")
        return {name: getattr(self, name) for name in names}


def mode_for(device: torch.device, own_graphs: bool) -> str:
    """Inductor's default on a CPU; on CUDA its CUDA graphs unless ours replay the step."""
    if device.type == "cuda" and not own_graphs:
        return "reduce-overhead"
    return "default"


def compile_model(
    model, own_graphs: bool = False, on_fallback: Callable[[str], None] | None = None
) -> CompileState:
    """Route the model's steps through torch.compile (model.compiled is the state). Packed
    weights are laid out strided first (the fastest strided layout): inductor packs its
    own, and dynamo does not trace opaque oneDNN tensors."""
    if model.layout.packed:
        from benchbatch.runtime import layout

        model.lay_out(layout.choose(model, packed=False))
    eager = model._run
    mode = mode_for(model.embed.weight.device, own_graphs)
    state = model.compiled = CompileState(mode)
    say = on_fallback or (lambda line: None)

    def traced(*args, **kwargs):
        if not torch.compiler.is_compiling():  # a constant False in a traced graph
            state.eager_calls += 1  # dynamo ran this call as plain Python
        return eager(*args, **kwargs)

    try:
        compiled = torch.compile(traced, mode=mode)
    except Exception as e:  # noqa: BLE001 - any failure to compile means eager, said once
        return _fall_back(model, state, eager, e, say)

    def run(*args, **kwargs):
        if not state.applied:
            return eager(*args, **kwargs)
        before, start, seen = _graph_count(), time.perf_counter(), state.counts()
        try:
            with _skips_noted(state):
                out = compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - the compiler failed: eager from here on
            if _graph_count() > before or state.graphs == 0:
                _fall_back(model, state, eager, e, say)
                return eager(*args, **kwargs)
            raise
        made = _graph_count() - before
        if made:
            state.graphs += made
            state.compile_s += time.perf_counter() - start
        if state.counts() != seen:
            state.sync()
        return out

    model._run = run
    return state


def _fall_back(model, state: CompileState, eager, error: Exception, say) -> CompileState:
    state.applied = False
    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
    state.fallback = f"{type(error).__name__}: {reason}"[:300]
    model._run = eager
    state.sync()
    say(f"--compile: torch.compile failed ({state.fallback}); running eager instead")
    return state


def compile_seconds(model) -> float:
    """Seconds spent compiling so far (0 for an eager model)."""
    state = getattr(model, "compiled", None)
    return state.compile_s if state is not None else 0.0


def row_columns(model, before: dict | None) -> dict:
    """A row's compile columns: seconds compiling, recompiles (new graphs after the first
    graph of the model), `eager` (a call of the row ran as plain Python: dynamo was past
    its recompile limit), and what the compiled step ran as; `before` is state.counts()
    when the row began. {} for an eager model."""
    state = getattr(model, "compiled", None)
    if state is None or before is None:
        return {}
    now = state.counts()
    graphs = now["graphs"] - before["graphs"]
    eager = now["eager_calls"] > before["eager_calls"]
    return {
        "compile_s": now["compile_s"] - before["compile_s"],
        "recompiles": max(0, graphs - (1 if before["graphs"] == 0 and graphs else 0)),
        "eager": eager,
        "compiled_ran": "eager (past dynamo's recompile limit)" if eager else state.ran,
    }


def counts(model) -> dict | None:
    """The compiled model's running totals (None for an eager model)."""
    state = getattr(model, "compiled", None)
    return state.counts() if state is not None else None


CUDAGRAPH_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"  # its artifact logger


class _SkipNotes(logging.Handler):
    def __init__(self, state: CompileState):
        super().__init__(logging.WARNING)
        self.state = state

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("skipping cudagraphs") and text not in self.state.skip_reasons:
            self.state.skip_reasons.append(text[:300])


@contextlib.contextmanager
def _skips_noted(state: CompileState):
    """Inductor's cudagraph skips during the block: counted, and their reasons kept."""
    from torch._dynamo.utils import counters

    before = counters["inductor"]["cudagraph_skips"]
    handler, log = _SkipNotes(state), logging.getLogger(CUDAGRAPH_LOGGER)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        state.cudagraph_skips += counters["inductor"]["cudagraph_skips"] - before


def _recompile_limit() -> int | None:
    import torch._dynamo

    config = torch._dynamo.config
    return getattr(config, "recompile_limit", getattr(config, "cache_size_limit", None))


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
