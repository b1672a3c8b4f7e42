"""`benchbatch serve`: the model behind an OpenAI-compatible streaming API until Ctrl-C,
SIGTERM or --duration; then steps.csv, requests.csv and metadata.json.

A signal is how a server is meant to stop: the run ends complete (exit 0) with everything
measured written, not interrupted. The main thread only waits: the model has its thread
(runtime/live.py) and the HTTP loop its own (net/server.py), so the signal lands where
Python delivers it, and the shutdown (the engine first, so no handler waits on a token that
will not come, then the HTTP server) runs with signals held.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.scheduler_config import SchedulerConfig
from benchbatch.errors import UserError
from benchbatch.experiments import common as c
from benchbatch.experiments.server.options import ServerOptions
from benchbatch.output.recorder import Recorder
from benchbatch.signals import signals_held

WAIT_S = 0.5  # the main thread wakes this often (a signal interrupts the wait anyway)


@dataclass
class Inputs:
    tokenizer: object | None = None
    tokenizer_path: Path | None = None
    chat_template: object | None = None  # net/chat.ChatTemplate
    max_model_len: int | None = None
    cpus: list[int] | None = None  # the process's, before open_model_run pins its thread


def open_run(
    opts: ServerOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> Recorder:
    """Every input checked (the policy's budgets, the context, the tokenizer, the port free)
    before the folder is made."""
    inputs = Inputs()
    policy, settings = opts.settings()
    SchedulerConfig(workload.slots, **settings)  # a budget the scheduler would refuse
    inputs.tokenizer_path = tokenizer_path(opts, model)
    inputs.tokenizer = load_tokenizer(inputs.tokenizer_path)
    inputs.chat_template = chat_template(opts, inputs.tokenizer_path)

    def check(cfg) -> None:
        inputs.max_model_len = max_model_len(opts, cfg)
        if inputs.tokenizer is not None and inputs.tokenizer.get_vocab_size() > cfg.vocab:
            raise UserError("tokenizer", f"{inputs.tokenizer_path} has "
                            f"{inputs.tokenizer.get_vocab_size():,} tokens, more than the "
                            f"model's vocabulary of {cfg.vocab:,}")  # fmt: skip
        check_port(opts.host, opts.port)

    def cache(cfg) -> tuple[int, int, str]:
        return workload.slots, max_model_len(opts, cfg), "max_model_len"

    if hasattr(os, "sched_getaffinity"):
        inputs.cpus = sorted(os.sched_getaffinity(0))
    rec = c.open_model_run("serve", model, run, opts, workload, check=check, cache=cache)
    rec.inputs = inputs
    return rec


def max_model_len(opts: ServerOptions, cfg) -> int:
    if opts.max_model_len is None:
        return cfg.max_context
    if opts.max_model_len > cfg.max_context:
        raise UserError("max_model_len", f"{opts.max_model_len:,} is more than the model's "
                        f"--max-context {cfg.max_context:,}")  # fmt: skip
    return opts.max_model_len


def tokenizer_path(opts: ServerOptions, model: ModelOptions) -> Path | None:
    """--tokenizer (a file, or a folder with tokenizer.json), else the checkpoint's own."""
    if opts.tokenizer is not None:
        path = opts.tokenizer / "tokenizer.json" if opts.tokenizer.is_dir() else opts.tokenizer
        if not path.is_file():
            raise UserError("tokenizer", f"{opts.tokenizer} is no tokenizer.json (nor a folder "
                            "holding one)")  # fmt: skip
        return path
    if model.model is not None and (model.model / "tokenizer.json").is_file():
        return model.model / "tokenizer.json"
    return None


def chat_template(opts: ServerOptions, tokenizer: Path | None):
    """--chat-template, else the one beside the tokenizer (net/chat.find_template); None
    where there is none. A template needs a tokenizer (chat messages are text)."""
    from benchbatch.net.chat import OPTION, find_template

    if opts.chat_template is not None and tokenizer is None:
        raise UserError(OPTION, "needs a tokenizer (--tokenizer, or a checkpoint with its "
                        "tokenizer.json): chat messages are text")  # fmt: skip
    return find_template(opts.chat_template, None if tokenizer is None else tokenizer.parent)


def load_tokenizer(path: Path | None):
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("tokenizer", "needs the tokenizers package: pip install "
                        "'benchbatch[hf]'") from None  # fmt: skip
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the Rust library raises plain Exceptions
        raise UserError("tokenizer", f"cannot read {path}: {str(e).splitlines()[0]}") from None


def check_port(host: str, port: int) -> None:
    """The port can be listened on now (0 always can): a UserError before any folder."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError("host", f"cannot resolve {host!r}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise UserError("port", f"cannot listen on {host}:{port}: {e.strerror}") from None


def served_name(opts: ServerOptions, model: ModelOptions, cfg) -> str:
    if opts.served_model_name is not None:
        return opts.served_model_name
    if model.model is not None:
        return Path(model.model).resolve().name
    return cfg.name


def measure_run(
    rec, opts: ServerOptions, workload: WorkloadOptions, model: ModelOptions, run: RunOptions
) -> None:
    """Build the model, start its thread and the HTTP server, say the URL, serve until a
    signal or --duration, then stop both and write what was measured."""
    from benchbatch.net.completions import Served
    from benchbatch.net.server import ServerThread, make_app
    from benchbatch.runtime.cores import cpu_busy, plan_cores
    from benchbatch.runtime.live import LiveEngine

    net, cfg = c.build_model(rec, model, run)
    inputs = rec.inputs
    policy, settings = opts.settings()
    engine = LiveEngine(net, policy, workload.slots, inputs.max_model_len, settings,
                        _stop_tokens(rec, model, cfg.vocab), name=opts.policy)  # fmt: skip
    busy = cpu_busy(inputs.cpus) if opts.pin else None  # other processes' cores
    cores = plan_cores(_threads(rec, run), opts.pin, inputs.cpus, busy)
    name = served_name(opts, model, cfg)
    # vLLM serves a checkpoint under the path it was given: a client given that path too
    # (vllm bench serve --model PATH) is answered, not told the model does not exist
    aliases = (str(model.model),) if model.model is not None and opts.served_model_name \
        is None else ()  # fmt: skip
    served = Served(engine, name, inputs.max_model_len, inputs.tokenizer,
                    chat_template=inputs.chat_template, aliases=aliases)  # fmt: skip
    server = ServerThread(make_app(served), opts.host, opts.port, cores.http_cores)
    engine.start(cores)
    stopped_by = "error"
    try:
        while not engine.ready.wait(WAIT_S):  # warm: the first client's step is no warm-up
            pass
        if engine.error is not None:
            raise RuntimeError(f"the model thread failed: {engine.error}") from engine.error
        url = _listen(server, opts)
        _announce(rec, opts, url, served, cores, engine, inputs)
        stopped_by = _wait(opts.duration, engine)
    except KeyboardInterrupt:
        stopped_by = "signal"
    finally:
        with signals_held():
            _shut(rec, engine, server, stopped_by)
            rec.meta["summary"]["error_responses"] = dict(sorted(served.error_responses.items()))
    if engine.error is not None:
        raise RuntimeError(f"the model thread failed: {engine.error}") from engine.error


def _threads(rec, run: RunOptions) -> int | None:
    """--threads, else the run's own choice (open_model_run's: one on a small or busy CPU
    machine), else every CPU but the HTTP loop's."""
    if run.threads is not None:
        return run.threads
    chosen = rec.meta.get("threads") or {}
    return chosen.get("threads") if rec.target.device.type == "cpu" else None


def _listen(server, opts: ServerOptions) -> str:
    try:
        return server.start()
    except OSError as e:  # taken since open_run found it free
        raise UserError("port", f"cannot listen on {opts.host}:{opts.port}: {e.strerror}") from None


def _stop_tokens(rec, model: ModelOptions, vocab: int) -> frozenset[int]:
    """A checkpoint's end-of-sequence ids (a request without ignore_eos stops at one); a
    checkpoint that names none the model can generate is served all the same, each request
    to its max_tokens, said."""
    if model.model is None:
        return frozenset()
    from benchbatch.core.checkpoint_config import eos_token_ids

    ids = eos_token_ids(model.model, vocab, required=False)
    if not ids:
        rec.warning(
            f"{model.model} names no end-of-sequence token the model can generate "
            f"(eos_token_id in generation_config.json or config.json, below its {vocab:,} "
            "tokens): every request runs to its max_tokens, as with ignore_eos"
        )
    return ids


def _announce(rec, opts: ServerOptions, url: str, served, cores, engine, inputs) -> None:
    """metadata.json says where the server listens, then the line a script waits for."""
    rec.meta["server"] = {
        "url": url,
        "served_model_name": served.name,
        "response_ids": f"cmpl-{served.run}-ID (chatcmpl- for chat; ID the request's in "
                        "requests.csv)",
        "policy": opts.policy,
        "slots": engine.slots,
        "scheduler_policy": engine.policy,
        "scheduler_settings": engine.settings,
        "max_model_len": inputs.max_model_len,
        "tokenizer": None if inputs.tokenizer_path is None else str(inputs.tokenizer_path),
        "chat_template": None if inputs.chat_template is None else inputs.chat_template.origin,
        "stop_tokens": sorted(engine.stop_tokens),
        "warmup_s": engine.warmup_s,
        **cores.row(),
    }
    rec.write_meta()
    rec.note(f"torch threads on the model thread: {cores.threads}; {cores.why}")
    rec.note(f"chat completions: the chat template of {inputs.chat_template.origin}"
             if inputs.chat_template is not None else
             "chat completions: no chat template (give --chat-template to serve them)")  # fmt: skip
    rec.say(f"listening on {url}")
    _flush()


def _flush() -> None:
    import sys

    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


def _wait(duration: float | None, engine) -> str:
    """Until --duration passes (or the model thread dies); a signal raises out of it."""
    end = None if duration is None else time.monotonic() + duration
    while engine.error is None:
        left = WAIT_S if end is None else min(WAIT_S, end - time.monotonic())
        if left <= 0:
            return "duration"
        time.sleep(left)
    return "error"


def _shut(rec, engine, server, stopped_by: str) -> None:
    """The engine stops first (live requests end aborted, so every handler returns), then
    the HTTP server; the steps and requests go to their CSVs."""
    engine.close()
    engine.join(60)
    server.stop()
    if engine.step_rows:
        rec.put("steps", engine.step_rows)
    rows = [r.row() for r in engine.requests]
    if rows:
        rec.put("requests", rows)
    rec.meta.setdefault("server", {})["stopped_by"] = stopped_by
    rec.meta["summary"] = summary(rows, engine.step_rows)


def summary(requests: list[dict], steps: list[dict]) -> dict:
    by = lambda status: sum(r["status"] == status for r in requests)  # noqa: E731
    return {
        "requests": len(requests),
        "finished": by("finished"),
        "cancelled": by("cancelled"),
        "aborted": by("aborted"),
        "output_tokens": sum(r["output_tokens"] for r in requests),
        "steps": len(steps),
        "busy_s": sum(s["step_ms"] for s in steps) / 1e3,
    }
