"""serve: benchbatch's own engine behind an OpenAI-compatible streaming API on 127.0.0.1
(options, run; the engine fed online is runtime/live.py, the HTTP app net/server.py)."""

from benchbatch.core.options import ModelOptions, RunOptions, WorkloadOptions
from benchbatch.core.optkit import use
from benchbatch.experiments.base import Experiment
from benchbatch.experiments.server.options import ServerOptions

RUN_FIELDS = ("device", "dtype", "seed", "threads", "out", "force", "json_out")

HELP = """Serve the model with benchbatch's own engine over an OpenAI-compatible API, so that
any serving benchmark (vLLM's bench serve, GuideLLM, serve-sweep --endpoint) can measure
its scheduler policies.

Listens on 127.0.0.1 (--port; 0 picks a free one) and prints `listening on URL` once it
accepts requests. GET /v1/models, GET /health, POST /v1/completions (stream true: OpenAI's
server-sent completion chunks, one per token, with stream_options.include_usage a usage
chunk; stream false: one JSON), POST /v1/chat/completions with a chat template (the
checkpoint's, or --chat-template: as vLLM, a chunk naming the role, then one a token), POST
/tokenize (a prompt or messages) and /detokenize with a tokenizer. Prompts are token ids, or
text with a tokenizer (--tokenizer, or the checkpoint's tokenizer.json). Greedy decoding
only (temperature 0): a request gets exactly the tokens the in-process engine gives it.
Outputs run to max_tokens (default 16) with ignore_eos, else stop at the checkpoint's
end-of-sequence token once they have min_tokens.

--policy static, continuous or chunked (chunked prefill under --max-num-batched-tokens),
--slots sequences at once (vLLM's max_num_seqs), every slot a KV-cache row of
--max-model-len tokens. A request that arrives while a step runs joins at the next step;
a client that disconnects frees its slot. The model runs on its own thread, apart from the
HTTP loop, pinned to its own cores where the platform allows (--threads, --no-pin).

Runs until Ctrl-C or SIGTERM (or --duration seconds), then writes steps.csv (every step:
what it computed, which requests it received, admitted, prefilled, decoded and finished),
requests.csv (each request's lengths, times and status) and metadata.json (the URL).
Try: `benchbatch serve --preset tiny --device cpu --port 0`.
"""

EXPERIMENT = Experiment(
    name="serve",
    help=HELP,
    options=(
        ServerOptions,
        use(WorkloadOptions, only=("slots",), defaults={"slots": 8}),
        ModelOptions,
        use(RunOptions, only=RUN_FIELDS),
    ),
    runs="benchbatch.experiments.server.run",
    order=85,
)
