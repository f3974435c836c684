"""Writes the trained demo model as a Hugging Face folder in the official Qwen3-VL-MoE layout.

    python3 tools/demo_model/export.py --work DIR --out models/zest-demo-vl

bf16 weights (fused experts as gate_up_proj [E, H, 2I], down_proj [E, I, H], as Qwen's checkpoints
store them) in one model.safetensors (shards of at most 15 MiB with an index if it would pass that), config.json,
generation_config.json (greedy), preprocessor_config.json and the tokenizer files. The folder is then
loaded back with transformers and compared tensor by tensor.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import safetensors.torch
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import make_fixtures  # noqa: E402
import train  # noqa: E402

SHARD_BYTES = 15 * 1024 * 1024
MIN_PIXELS = 64 * 64  # the smallest task images
MAX_PIXELS = 1024 * 1024  # at most 1024 visual tokens an image


def save_sharded(tensors: dict, out: Path) -> None:
    shards, cur, size = [], {}, 0
    for key in sorted(tensors):
        n = tensors[key].numel() * tensors[key].element_size()
        if cur and size + n > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[key] = tensors[key]
        size += n
    shards.append(cur)
    if len(shards) == 1:
        safetensors.torch.save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.torch.save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    make_fixtures.write_json(out / "model.safetensors.index.json",
                             {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def export(work: str, out: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    special = train.special_ids(work)
    cfg = train.model_config(special)
    model = train.build_model(cfg, "")
    st = torch.load(os.path.join(work, "ckpt.pt"), map_location="cpu")
    model.load_state_dict(st["model"])
    cfg.dtype = torch.bfloat16
    cfg.text_config.dtype = torch.bfloat16
    cfg.vision_config.dtype = torch.bfloat16
    save_sharded(make_fixtures.official_tensors("qwen3_vl_moe_tiny", model), out)
    make_fixtures.write_config("qwen3_vl_moe_tiny", cfg, out)
    eos = special["<|im_end|>"]
    make_fixtures.write_json(out / "generation_config.json", {
        "bos_token_id": special["<|endoftext|>"], "pad_token_id": special["<|endoftext|>"],
        "eos_token_id": [eos, special["<|endoftext|>"]], "do_sample": False})
    pre = dict(make_fixtures.PREPROCESSOR_CONFIG)
    pre["size"] = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    make_fixtures.write_json(out / "preprocessor_config.json", pre)
    tok = Path(work) / "tokenizer"
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copyfile(tok / f, out / f)
    check(model, out)
    print(f"wrote {out} (step {st['step']})")


def check(model, out: Path) -> None:
    """Loads the folder with transformers and compares every weight with the trained one (bf16)."""
    from transformers import Qwen3VLMoeForConditionalGeneration

    back = Qwen3VLMoeForConditionalGeneration.from_pretrained(str(out), dtype=torch.float32)
    want = model.state_dict()
    got = back.state_dict()
    assert set(want) == set(got), set(want) ^ set(got)
    for k, v in want.items():
        if not torch.equal(v.to(torch.bfloat16).float(), got[k]):
            raise AssertionError(f"{k} differs after export")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    export(a.work, a.out)


if __name__ == "__main__":
    main()
