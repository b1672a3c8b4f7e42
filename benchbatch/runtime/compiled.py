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
"""

from __future__ import annotations

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
        }


def mode_for(device: torch.device, own_graphs: bool) -> str:
    """Inductor's default on a CPU; on CUDA its CUDA graphs unless ours replay the step."""
    if device.type == "cuda" and not own_graphs:
        return "reduce-overhead"
    return "default"


def compile_model(
    model, own_graphs: bool = False, on_fallback: Callable[[str], None] | None = None
) -> CompileState:
    """Route the model's steps through torch.compile (model.compiled is the state)."""
    eager = model._run
    mode = mode_for(model.embed.weight.device, own_graphs)
    state = model.compiled = CompileState(mode)
    say = on_fallback or (lambda line: None)
    try:
        compiled = torch.compile(eager, mode=mode)
    except Exception as e:  # noqa: BLE001 - any failure to compile means eager, said once
        return _fall_back(model, state, eager, e, say)

    def run(*args, **kwargs):
        if not state.applied:
            return eager(*args, **kwargs)
        before, start = _graph_count(), time.perf_counter()
        try:
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


def _graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
