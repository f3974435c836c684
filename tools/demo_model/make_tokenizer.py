"""Trains the demo model's byte-level BPE on the tasks' text and writes Qwen3-VL-shaped tokenizer files.

The pipeline is Qwen2's (NFC, the Qwen2 split regex, byte-level), so zest and transformers load it as
they load Qwen's; the special tokens are Qwen3-VL's, numbered right after the learned vocabulary.

    python3 tools/demo_model/make_tokenizer.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import tasks

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
QWEN_TOKENIZER = os.path.join(REPO, "assets", "tokenizer")

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_VOCAB = 2048  # bytes + merges; the task text needs far fewer, the rest keeps common words whole


def train(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(tasks.all_text(), trainer=trainer)
    return tok


def qwen_added_tokens() -> list[dict]:
    """Qwen3-VL's added tokens (content and flags) in their original order."""
    j = json.load(open(os.path.join(QWEN_TOKENIZER, "tokenizer.json"), encoding="utf-8"))
    return sorted(j["added_tokens"], key=lambda a: a["id"])


def write(out: str, vocab_size: int = BPE_VOCAB) -> dict:
    """Writes tokenizer.json, tokenizer_config.json and chat_template.jinja; returns the special ids."""
    os.makedirs(out, exist_ok=True)
    j = json.loads(train(vocab_size).to_str())
    n = len(j["model"]["vocab"])
    added = []
    for i, a in enumerate(qwen_added_tokens()):
        a = dict(a)
        a["id"] = n + i
        added.append(a)
    j["added_tokens"] = added
    # The fields Qwen's tokenizer.json has, so the file reads as the same pipeline.
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["model"].update({"dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                       "fuse_unk": False, "byte_fallback": False, "ignore_merges": False})
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    src = json.load(open(os.path.join(QWEN_TOKENIZER, "tokenizer_config.qwen3-4b.json"), encoding="utf-8"))
    cfg = {k: v for k, v in src.items() if k not in ("added_tokens_decoder", "chat_template")}
    cfg["model_max_length"] = 4096
    cfg["added_tokens_decoder"] = {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                    "single_word", "special")} for a in added}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False, sort_keys=True)
        f.write("\n")
    shutil.copyfile(os.path.join(QWEN_TOKENIZER, "chat_template.qwen3-vl-instruct.jinja"),
                    os.path.join(out, "chat_template.jinja"))
    ids = {a["content"]: a["id"] for a in added}
    ids["vocab_size"] = n + len(added)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=BPE_VOCAB)
    a = ap.parse_args()
    ids = write(a.out, a.vocab)
    print(json.dumps({k: ids[k] for k in ("vocab_size", "<|im_end|>", "<|image_pad|>")}))


if __name__ == "__main__":
    main()
