"""Generate a tiny, randomly initialised Llama model that a real vLLM can serve.

No weights can be downloaded here, so this builds one locally and deterministically:

* a byte-level BPE tokenizer (``tokenizers``, 8192 entries) trained on text made from
  the Python standard library's own source files (sorted, capped in size) plus words
  generated with a fixed seed;
* a ``LlamaConfig`` (hidden 512, 8 layers, 8 heads, vocabulary 8192, 8192 positions,
  about 31M parameters) with random weights from a fixed seed, stored as bfloat16;
* a plain chat template: ``<|role|>\\ncontent\\n`` per message, ending with
  ``<|assistant|>\\n`` when ``add_generation_prompt`` is set.

Both are ``save_pretrained``-ed into one folder (default ``.cache/tiny-llama`` at the
repo root). The model's output is noise; its timing, caching and scheduling are real.

Run with the vLLM venv's python (it needs torch, transformers and tokenizers)::

    .venv-vllm/bin/python bench/vllm/make_model.py [--out DIR] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "tiny-llama"

VOCAB_SIZE = 8192
HIDDEN = 512
LAYERS = 8
HEADS = 8
INTERMEDIATE = 1152  # with untied embeddings this gives ~31M parameters
MAX_POSITIONS = 8192
SEED = 1234
CORPUS_CHARS = 6_000_000  # stdlib text used for BPE training (deterministic subset)

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def stdlib_texts(limit_chars: int) -> list[str]:
    """Source text of the stdlib's .py files, in sorted path order, up to ``limit_chars``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in stdlib.rglob("*.py")
        if "site-packages" not in p.parts and "test" not in p.parts and "tests" not in p.parts
    )
    texts: list[str] = []
    total = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit_chars:
            break
    return texts


def generated_texts(n_docs: int = 2000, seed: int = SEED) -> list[str]:
    """Pseudo-English prose from a fixed syllable inventory and a fixed seed."""
    rng = random.Random(seed)
    onsets = [
        "",
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "st",
        "tr",
        "pl",
        "ch",
        "sh",
        "th",
        "br",
        "gr",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "st", "ng", "m"]
    words = sorted(
        {
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.choice([1, 1, 2, 2, 3]))
            )
            for _ in range(6000)
        }
    )
    weights = [1.0 / (i + 1) for i in range(len(words))]  # Zipf-like
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(3, 12)):
            ws = rng.choices(words, weights=weights, k=rng.randint(4, 20))
            sentences.append(" ".join(ws).capitalize() + rng.choice([".", ".", ".", "?", "!"]))
        docs.append(" ".join(sentences))
    return docs


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def build(out: Path) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    t0 = time.time()
    texts = stdlib_texts(CORPUS_CHARS) + generated_texts()
    print(
        f"[make_model] corpus: {len(texts)} documents, {sum(map(len, texts)):,} chars", flush=True
    )
    raw = train_tokenizer(texts)
    print(
        f"[make_model] tokenizer trained: vocab {raw.get_vocab_size()} ({time.time() - t0:.1f} s)",
        flush=True,
    )

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.eval()
    model = model.to(torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[make_model] model: {n_params / 1e6:.1f}M parameters", flush=True)

    # write into a temporary sibling folder, then move into place (no half-written model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    # sanity check: round trip through the chat template
    tok2 = PreTrainedTokenizerFast.from_pretrained(out)
    prompt = tok2.apply_chat_template(
        [{"role": "user", "content": "hello world"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|user|>\nhello world\n<|assistant|>\n", repr(prompt)
    digest = hashlib.sha256((out / "tokenizer.json").read_bytes()).hexdigest()[:16]
    print(f"[make_model] tokenizer.json sha256[:16] = {digest}", flush=True)
    print(f"[make_model] saved to {out} in {time.time() - t0:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    ap.add_argument("--force", action="store_true", help="rebuild even if the folder exists")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if (out / "config.json").exists() and not args.force:
        print(f"[make_model] {out} exists; use --force to rebuild")
        return 0
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
