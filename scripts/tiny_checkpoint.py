"""A tiny random-weight Llama checkpoint with an offline tokenizer, for serving checks.

    python3 scripts/tiny_checkpoint.py DIR [--vocab 2048] [--seed 0]

Writes DIR/config.json, model.safetensors, generation_config.json (saved by transformers'
LlamaForCausalLM, float32), and a byte-level BPE tokenizer trained with the `tokenizers`
library on this repository's own .py and .md files to exactly the vocabulary size:
tokenizer.json, tokenizer_config.json (with a plain chat template, so that vLLM and benchbatch
serve answer chat completions) and special_tokens_map.json. vLLM, transformers and
benchbatch (`--model DIR`) all load the folder offline; nothing is downloaded.

A byte-level BPE (not a made-up word-level vocabulary) is what lets any client's prompt text
round-trip into real token ids: every byte is in the vocabulary, so nothing becomes unknown.
The shape is that of issue 26's measurements: hidden 512, 4 layers, 8 heads, float32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECIAL = ("<s>", "</s>", "<unk>")  # ids 0, 1, 2: bos, eos, unk
# Each message as a role line and its text, then the assistant's turn opened.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SHAPE = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def corpus_files(root: Path = REPO) -> list[str]:
    """The repository's own text, sorted so the trained vocabulary is reproducible."""
    files = [p for ext in ("*.py", "*.md") for p in root.rglob(ext)]
    keep = [p for p in files if not any(part.startswith(".") for part in p.parts)]
    return [str(p) for p in sorted(keep)]


def train_tokenizer(vocab: int, files: list[str]):
    """A byte-level BPE of exactly `vocab` tokens (the 3 special ones first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    if tok.get_vocab_size() != vocab:
        raise SystemExit(f"the corpus gave {tok.get_vocab_size()} tokens, not {vocab}")
    return tok


def write_tokenizer(folder: Path, tok) -> None:
    tok.save(str(folder / "tokenizer.json"))
    bos, eos, unk = SPECIAL
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": SHAPE["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": bos, "eos_token": eos, "unk_token": unk}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def write_model(folder: Path, vocab: int, seed: int) -> None:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab, bos_token_id=0, eos_token_id=1, torch_dtype="float32", **SHAPE
    )
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)


def make(folder: str | Path, vocab: int = 2048, seed: int = 0) -> Path:
    """Write the checkpoint into folder (created) and return it; idempotent in content."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_tokenizer(folder, train_tokenizer(vocab, corpus_files()))
    write_model(folder, vocab, seed)
    return folder


def is_complete(folder: str | Path) -> bool:
    """Every file there, and the tokenizer's config as this version writes it (a folder made
    before the chat template was added is made again)."""
    names = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    if not all((Path(folder) / n).is_file() for n in names):
        return False
    try:
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text())
    except ValueError:
        return False
    return config.get("chat_template") == CHAT_TEMPLATE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the checkpoint (created)")
    parser.add_argument("--vocab", type=int, default=2048, help="vocabulary size (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="weights' random seed (default 0)")
    args = parser.parse_args()
    print(make(args.folder, args.vocab, args.seed))


if __name__ == "__main__":
    main()
