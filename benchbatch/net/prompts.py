"""Prompts of exact token lengths, for a server that takes text: the workload says a request
has n prompt tokens, and the prompt sent must encode to exactly n.

Three sources, in this order of preference:
- the checkpoint's tokenizer.json (the `tokenizers` package, the optional `hf` extra): random
  token ids are decoded to text, the text re-encoded, and cut or extended until its encoding
  (without special tokens) has exactly n ids;
- the server's own POST /tokenize (vLLM's, benchbatch serve's): plain words, seeded, as many
  as fit in n tokens (a bisection on the count the server gives), then one-token fillers
  (punctuation, one-letter words) until the count is n;
- neither: token-id lists (random ids below the vocabulary size), which vLLM and benchbatch's
  server take as `prompt` as they are.
A text is returned only once its count, just taken, is exactly n.
A server adds its special tokens (a BOS) to a text prompt, so its usage.prompt_tokens may be
n + 1; Streamed.server_prompt_tokens records what it counted. Every source is deterministic
per seed (the server's given the same tokenizer); prompt i draws from its own seeded stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Sequence
from pathlib import Path

import numpy as np

from benchbatch.errors import UserError

OPTION = "tokenizer"
MAX_DRAWS = 8  # fresh random starts before giving up on a length
MAX_ROUNDS = 64  # cut/extend rounds per start (two or three are the rule)
SERVER_CONCURRENCY = 8  # prompts searched at once against a server
# Plain words for the server's search (each is one token or a few in any tokenizer), and
# fillers that add one token in the common ones (a single byte is a byte-level BPE token).
FILLERS = (".", ",", " a", "!", " I", ";", "?", " x", ":", " -", " 1", "'")
WORDS = (
    "the of and to in is was for on that with as by at from his her an which it be are this "
    "not had but or have one were their all they new two more time after first other about "
    "city year world music river north small house night light water field paper number "
    "system market garden station winter summer morning island forest letter mountain story"
)

Search = Generator[tuple[str, object], object, str]


def exact_prompts(
    lengths: Sequence[int],
    seed: int,
    *,
    tokenizer: Path | str | None = None,
    endpoint=None,
    vocab: int | None = None,
) -> list[str | list[int]]:
    """One prompt per length: text of exactly that many tokens by the tokenizer.json (a file
    or a checkpoint folder holding one), else by the server's /tokenize (endpoint: a
    net.endpoint.Endpoint whose model is set: the one server_info chose), else random token
    ids below vocab."""
    lengths = [int(n) for n in lengths]
    assert all(n >= 1 for n in lengths), "a prompt has at least one token"
    if tokenizer is not None:
        encode, decode, pool = file_coder(tokenizer)
        return [
            _drive(search(n, _rng(seed, i), pool), encode, decode) for i, n in enumerate(lengths)
        ]
    if endpoint is not None:
        from benchbatch.net.endpoint import run_in_thread

        return run_in_thread(lambda: _server_prompts(lengths, seed, endpoint))
    if vocab is not None:
        return token_id_prompts(lengths, seed, vocab)
    raise UserError(
        OPTION,
        "exact prompt lengths need a tokenizer.json, a server with /tokenize, or a vocab size",
    )


def token_id_prompts(lengths: Sequence[int], seed: int, vocab: int) -> list[list[int]]:
    """Random token ids in [0, vocab), prompt i from its own seeded stream."""
    if vocab < 1:
        raise UserError(OPTION, f"the vocabulary size must be >= 1, not {vocab}")
    return [_rng(seed, i).integers(0, vocab, n).tolist() for i, n in enumerate(lengths)]


def _rng(seed: int, i: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), i])


def search(n: int, rng: np.random.Generator, pool: np.ndarray) -> Search:
    """The search for a text of exactly n tokens, as a generator: it yields ("decode", ids)
    or ("encode", text), is sent the answer, and returns the text. It returns only a text
    whose encoding it has just counted as n; a UserError after MAX_DRAWS fresh starts."""
    for _ in range(MAX_DRAWS):
        text = yield ("decode", rng.choice(pool, n).tolist())
        for _ in range(MAX_ROUNDS):
            ids = yield ("encode", text)
            if len(ids) == n:
                return text
            if len(ids) > n:  # decoded ids merged less than they were: cut the encoding
                text = yield ("decode", list(ids[:n]))
            else:  # they merged more: extend by random ids
                text += yield ("decode", rng.choice(pool, n - len(ids)).tolist())
    raise UserError(OPTION, f"found no text that encodes to exactly {n} tokens")


def word_search(n: int, rng: np.random.Generator) -> Search:
    """The search by counts alone (a server's /tokenize): it yields ("encode", text) and is
    sent the ids. Each word is at least one token, so n words are enough: the most of them
    whose count is at most n (bisection), then fillers that add exactly one token each."""
    words = [str(w) for w in rng.choice(WORDS.split(), n)]
    lo, hi, count = 0, n, 0  # the first lo words count `count` <= n tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        got = len((yield ("encode", " ".join(words[:mid]))))
        if got <= n:
            lo, count = mid, got
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    start = int(rng.integers(len(FILLERS)))
    while count < n:
        for k in range(len(FILLERS)):
            longer = text + FILLERS[(start + k) % len(FILLERS)]
            got = len((yield ("encode", longer)))
            if got == count + 1:
                text, count, start = longer, got, start + k + 1
                break
        else:
            raise LookupError(f"no filler adds one token to a text of {count} (wanted {n})")
    return text


def _drive(gen: Search, encode: Callable, decode: Callable) -> str:
    answer = None
    try:
        while True:
            kind, arg = gen.send(answer)
            answer = encode(arg) if kind == "encode" else decode(arg)
    except StopIteration as done:
        return done.value


def file_coder(path: Path | str) -> tuple[Callable, Callable, np.ndarray]:
    """encode, decode and the ids worth drawing (no special token, each decoding alone to
    printable text) of a tokenizer.json, or of the one in a checkpoint folder."""
    from benchbatch.core.prompts import load_tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    missing = f"{file} is not a file (a tokenizer.json or a folder with one)"
    tok = load_tokenizer(file, OPTION, "exact prompts from a tokenizer.json", missing)
    special = set(tok.get_added_tokens_decoder())
    size = tok.get_vocab_size(with_added_tokens=True)
    pieces = tok.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
    pool = np.array([i for i, p in enumerate(pieces) if i not in special and _clean(p)], np.int64)
    if pool.size == 0:
        raise UserError(OPTION, f"{file} has no ordinary token to build prompts from")

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=True)

    return encode, decode, pool


def _clean(piece: str) -> bool:
    printable = piece.isprintable() or piece.strip().isprintable()
    return bool(piece.strip()) and "\ufffd" not in piece and printable


async def _server_prompts(lengths: Sequence[int], seed: int, endpoint) -> list[str]:
    import aiohttp

    from benchbatch.net.discovery import served_model, tokenize

    timeout = aiohttp.ClientTimeout(total=endpoint.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=endpoint.headers()) as session:
        model = endpoint.model or await served_model(session, endpoint)

        async def encode(text):
            return await tokenize(session, endpoint, model, text)

        gate = asyncio.Semaphore(SERVER_CONCURRENCY)

        async def one(i, n):
            async with gate:
                return await _drive_async(word_search(n, _rng(seed, i)), encode)

        try:
            return list(await asyncio.gather(*(one(i, n) for i, n in enumerate(lengths))))
        except (aiohttp.ClientError, asyncio.TimeoutError, LookupError, ValueError) as e:
            raise UserError(
                "endpoint",
                f"cannot build prompts of exact lengths with {endpoint.public}/tokenize "
                f"({e or type(e).__name__}): give the checkpoint's tokenizer.json",
            ) from None


async def _drive_async(gen: Search, encode) -> str:
    answer = None
    try:
        while True:
            _, text = gen.send(answer)
            answer = await encode(text)
    except StopIteration as done:
        return done.value
