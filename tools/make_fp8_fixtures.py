#!/usr/bin/env python3
"""Builds zest's block-wise FP8 test fixture and records transformers' outputs for it.

Run from the repository root:

    python3 tools/make_fp8_fixtures.py --out tests/fixtures/fp8

Writes (everything seeded; a rerun gives the same bytes):

- e4m3_table.npy: float32 [256], torch's float8_e4m3fn -> float32 conversion of every byte (the
  reference of zest's FP8 decoding test).
- models/qwen3_moe_fp8_tiny/: a purpose-made Qwen3-MoE checkpoint in the format of Qwen's official -FP8
  releases: every nn.Linear weight float8_e4m3fn (safetensors F8_E4M3) with a float32 "<weight>_scale_inv"
  of one scale per 128x128 block, [ceil(out/128), ceil(in/128)]; embeddings, norms, routers, lm_head and
  the modules listed in quantization_config.modules_to_not_convert bf16. Its sizes put weights on one
  block, on several full blocks and on full blocks followed by a partial edge block. A small byte-level BPE
  tokenizer (the first 998 ids of Qwen's tokenizer, its merges among them, and Qwen's 26 added tokens
  renumbered from 998) keeps the vocabulary at 1024 rows.
- ref/qwen3_moe_fp8_tiny/<case>.json + <case>.logits.npy: transformers in float32 on the dequantized
  weights (see the README for why not transformers' own FP8 loader).

The quantization is the one of the official checkpoints: per 128x128 block, scale_inv = amax / 448 (f32),
q = round-to-nearest-even(w / scale_inv) to e4m3 (w / scale_inv is within [-448, 448]). It is done in
numpy from the format definition and checked bit for bit against torch's float8_e4m3fn cast; the
dequantization (f32(q) * scale_inv, one f32 product) is numpy as well and is checked against
transformers' Fp8Dequantize on the weights whose sizes that code handles.
"""

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Dequantize
from transformers.quantizers.quantizers_utils import should_convert_module

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures as mf  # noqa: E402  (the shared init rule, layouts and text cases)

NAME = "qwen3_moe_fp8_tiny"
SEED = 4004
QWEN_FIRST_ADDED = 151643  # <|endoftext|> in Qwen's tokenizer
REGULAR_TOKENS = 998  # kept regular ids 0..997: the 256 byte symbols and the first 742 merges
VOCAB_SIZE = 1024  # 998 regular + 26 added tokens
BLOCK = 128
FP8_MAX = 448.0
GREEDY_STEPS = 16
MODULES_TO_NOT_CONVERT = ["lm_head", "mlp.gate", "model.layers.2.self_attn.o_proj"]
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [BLOCK, BLOCK],
    "modules_to_not_convert": MODULES_TO_NOT_CONVERT,
}
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


# ----------------------------------------------------------------------------------------------
# float8_e4m3fn from the format definition
# ----------------------------------------------------------------------------------------------


def e4m3_decode_table():
    """float64 value of every byte: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 NaN."""
    table = np.zeros(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, mant = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and mant == 0x7:
            table[code] = math.copysign(math.nan, sign)  # NaN keeps its sign bit
        elif exp == 0:
            table[code] = sign * mant * 2.0 ** -9
        else:
            table[code] = sign * (1.0 + mant / 8.0) * 2.0 ** (exp - 7)
    return table


E4M3 = e4m3_decode_table()


def e4m3_encode(x):
    """float32 array within [-448, 448] -> uint8 codes, round to nearest, ties to even mantissa."""
    x = np.asarray(x, dtype=np.float64)
    assert np.all(np.isfinite(x)) and np.all(np.abs(x) <= FP8_MAX)
    a = np.abs(x)
    # The spacing of e4m3 values around a: 2^(e-3) in the binade [2^e, 2^(e+1)), e >= -6; 2^-9 below 2^-6.
    _, ex = np.frexp(a)  # a = m * 2^ex, m in [0.5, 1): e = ex - 1, exact
    e = np.maximum(ex.astype(np.float64) - 1.0, -6.0)
    step = 2.0 ** (e - 3)
    q = np.round(a / step) * step  # numpy rounds halves to even; a / step is exact (power-of-two step)
    # Map each value to its code through the positive half of the table (value -> code, +0 for 0).
    pos = {float(v): c for c, v in enumerate(E4M3[:0x7F])}
    codes = np.vectorize(lambda v: pos[float(v)], otypes=[np.uint8])(q)
    return np.where(np.signbit(x), codes | 0x80, codes).astype(np.uint8)  # -0 is 0x80, as torch casts it


def quantize_blocks(w):
    """float32 [rows, cols] -> (uint8 e4m3 codes, float32 scale_inv [ceil(rows/128), ceil(cols/128)])."""
    rows, cols = w.shape
    gr, gc = -(-rows // BLOCK), -(-cols // BLOCK)
    q = np.zeros((rows, cols), dtype=np.uint8)
    scale = np.zeros((gr, gc), dtype=np.float32)
    for br in range(gr):
        for bc in range(gc):
            blk = w[br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK].astype(np.float32)
            amax = np.float32(np.abs(blk).max())
            s = np.float32(amax / np.float32(FP8_MAX)) if amax > 0 else np.float32(1.0)
            scaled = np.clip((blk / s).astype(np.float32), -FP8_MAX, FP8_MAX)
            codes = e4m3_encode(scaled)
            # The same step with torch's cast must give the same bytes.
            t = torch.from_numpy(scaled.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            assert np.array_equal(t, codes), "numpy e4m3 rounding differs from torch's float8_e4m3fn cast"
            q[br * BLOCK:(br + 1) * BLOCK, bc * BLOCK:(bc + 1) * BLOCK] = codes
            scale[br, bc] = s
    return q, scale


def dequantize_blocks(q, scale):
    """w[r, c] = f32(e4m3(q[r, c])) * scale[r // 128, c // 128], one float32 product."""
    rows, cols = q.shape
    vals = E4M3[q].astype(np.float32)
    s = np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:rows, :cols]
    return (vals * s).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Tokenizer, config, weights
# ----------------------------------------------------------------------------------------------


def small_tokenizer():
    """Qwen's tokenizer.json cut to its first 998 ids (+ its 26 added tokens renumbered from 998)."""
    src = json.loads((mf.TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    model = src["model"]
    vocab = {tok: i for tok, i in model["vocab"].items() if i < REGULAR_TOKENS}
    assert len(vocab) == REGULAR_TOKENS
    merges = model["merges"][: REGULAR_TOKENS - 256]
    for i, (a, b) in enumerate(merges):
        # Qwen's merge i creates id 256 + i, so the kept merges only produce kept ids.
        assert vocab[a + b] == 256 + i and vocab[a] < 256 + i and vocab[b] < 256 + i
    added = []
    for t in src["added_tokens"]:
        t = dict(t)
        t["id"] = t["id"] - QWEN_FIRST_ADDED + REGULAR_TOKENS
        added.append(t)
    assert max(t["id"] for t in added) == VOCAB_SIZE - 1
    out = dict(src)
    out["added_tokens"] = added
    out["model"] = dict(model, vocab=dict(sorted(vocab.items(), key=lambda kv: kv[1])), merges=merges)
    ids = {t["content"]: t["id"] for t in added}
    return out, ids


def build_config(special):
    bos = special["<|endoftext|>"]
    cfg = Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=160,  # one full 128-column block + a partial one of 32
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,  # q_proj [256, 160]: two full row blocks; k/v_proj [128, 160]: exactly one
        hidden_act="silu",
        rms_norm_eps=1e-6,
        attention_bias=False,
        max_position_embeddings=4096,
        bos_token_id=bos,
        eos_token_id=special["<|im_end|>"],
        intermediate_size=200,  # the dense layer: gate/up [200, 160], down [160, 200]
        moe_intermediate_size=48,  # experts: [48, 160] and [160, 48]
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.dtype = torch.bfloat16
    return cfg


def is_quantized(key, t):
    """Whether an official tensor is an nn.Linear weight that the quantization config converts."""
    if t.ndim != 2 or not key.endswith(".weight") or key.endswith("embed_tokens.weight") or "norm" in key:
        return False
    return should_convert_module(key[: -len(".weight")], MODULES_TO_NOT_CONVERT)


def shard_of(key):
    """Layers 0-1 and the embeddings in the first shard, the rest in the second; layer 1's scales go to the
    second shard too, away from their weights."""
    layer = mf.layer_of(key)
    if key.endswith("_scale_inv") and layer == 1:
        return 1
    return 0 if key == "model.embed_tokens.weight" or (layer is not None and layer < 2) else 1


def write_model(model_dir, tensors_bf16, tok_json, special):
    """Quantizes and writes the FP8 checkpoint; returns (stored tensors, dequantized f32 weights, stats)."""
    stored, deq = {}, {}
    stats = {"fp8_weights": 0, "bf16_tensors": 0, "scale_tensors": 0, "partial_block_weights": 0,
             "multi_block_weights": 0, "full_then_partial_weights": 0}
    for key in sorted(tensors_bf16):
        t = tensors_bf16[key]
        if not is_quantized(key, t):
            stored[key] = t
            deq[key] = t.to(torch.float32).numpy()
            stats["bf16_tensors"] += 1
            continue
        w = t.to(torch.float32).numpy()
        q, s = quantize_blocks(w)
        stored[key] = torch.from_numpy(q).view(torch.float8_e4m3fn)
        stored[key + "_scale_inv"] = torch.from_numpy(s)
        deq[key] = dequantize_blocks(q, s)
        stats["fp8_weights"] += 1
        stats["scale_tensors"] += 1
        rows, cols = w.shape
        if rows % BLOCK or cols % BLOCK:
            stats["partial_block_weights"] += 1
        if s.size > 1:
            stats["multi_block_weights"] += 1
        if (rows > BLOCK and rows % BLOCK) or (cols > BLOCK and cols % BLOCK):
            stats["full_then_partial_weights"] += 1
    shards = [{}, {}]
    for key, t in stored.items():
        shards[shard_of(key)][key] = t.contiguous()
    weight_map = {}
    for shard_name, shard in zip(SHARDS, shards):
        safetensors.torch.save_file(shard, str(model_dir / shard_name), metadata={"format": "pt"})
        weight_map.update({k: shard_name for k in shard})
    total = sum(t.numel() * t.element_size() for t in stored.values())
    mf.write_json(model_dir / "model.safetensors.index.json",
                  {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})

    (model_dir / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False) + "\n", encoding="utf-8")
    src = json.loads((mf.TOKENIZER_DIR / "tokenizer_config.qwen3-4b.json").read_text())
    mf.write_json(model_dir / "tokenizer_config.json",
                  {k: v for k, v in src.items() if k not in ("added_tokens_decoder", "chat_template")})
    shutil.copyfile(mf.TOKENIZER_DIR / "chat_template.qwen3.jinja", model_dir / "chat_template.jinja")
    eos = [special["<|im_end|>"], special["<|endoftext|>"]]
    gen = {"bos_token_id": eos[1], "pad_token_id": eos[1], "do_sample": True, "eos_token_id": eos,
           "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": transformers.__version__}
    mf.write_json(model_dir / "generation_config.json", gen)
    return stored, deq, stats


def write_config(cfg, model_dir):
    """config.json as transformers writes it, the keys Qwen's checkpoints carry, and the FP8 section."""
    cfg.save_pretrained(str(model_dir))
    path = model_dir / "config.json"
    d = json.loads(path.read_text())
    for key, value in (("num_experts", d["num_local_experts"]), ("rope_theta", d["rope_parameters"]["rope_theta"]),
                       ("rope_scaling", None), ("max_window_layers", d["num_hidden_layers"]),
                       ("torch_dtype", "bfloat16")):
        d.setdefault(key, value)
    d["quantization_config"] = dict(QUANTIZATION_CONFIG)
    mf.write_json(path, d)


# ----------------------------------------------------------------------------------------------
# Checks and reference outputs
# ----------------------------------------------------------------------------------------------


def check_transformers_dequant(stored, deq):
    """Compares transformers' Fp8Dequantize with the numpy dequantization, weight by weight.

    transformers 5.17 derives the block as (rows // scale_rows, cols // scale_cols); that is 128 only when a
    size is a multiple of 128 or below it. Returns (weights that agree bit for bit: four synthetic ones of such
    sizes and the fixture's that have them, [(weight, same bits anyway)] for the fixture's others: the same only
    where the misplaced blocks happen to have equal scales).
    """
    op = Fp8Dequantize(None)
    agree, cannot = 0, []
    # Seeded random weights of sizes it handles (several full blocks, single partial blocks).
    gen = torch.Generator().manual_seed(SEED + 1)
    for shape in [(256, 384), (48, 128), (128, 64), (384, 24)]:
        w = mf.bf16_round(torch.randn(shape, generator=gen) * 0.05).numpy()
        q, sc = quantize_blocks(w)
        got = op._dequantize_one(torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(sc),
                                 output_dtype=torch.float32).numpy()
        assert np.array_equal(got, dequantize_blocks(q, sc)), f"{shape}: Fp8Dequantize differs from numpy"
        agree += 1
    for key, t in stored.items():
        if t.dtype != torch.float8_e4m3fn:
            continue
        s = stored[key + "_scale_inv"]
        rows, cols = t.shape
        ok_sizes = all(n <= BLOCK or n % BLOCK == 0 for n in (rows, cols))
        try:
            got = op._dequantize_one(t, s, output_dtype=torch.float32).numpy()
            same = np.array_equal(got, deq[key])
        except ValueError:
            same = False
        if ok_sizes:
            assert same, f"{key}: transformers' Fp8Dequantize differs from the numpy dequantization"
            agree += 1
        else:
            cannot.append((f"{key} {list(t.shape)}", same))
    return agree, cannot


def load_reference_model(cfg, deq, tmp):
    """transformers' Qwen3MoeForCausalLM in float32 on the dequantized weights (official per-expert layout)."""
    tmp = Path(tmp)
    cfg.save_pretrained(str(tmp))
    safetensors.torch.save_file({k: torch.from_numpy(v.copy()) for k, v in deq.items()}, str(tmp / "model.safetensors"),
                                metadata={"format": "pt"})
    model, info = Qwen3MoeForCausalLM.from_pretrained(
        str(tmp), dtype=torch.float32, attn_implementation=mf.ATTN_IMPLEMENTATION,
        experts_implementation=mf.EXPERTS_IMPLEMENTATION, output_loading_info=True)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{k} = {info.get(k)}"
    # Every parameter is the dequantized tensor (transformers fuses the experts as [E, 2I, H] / [E, H, I]).
    back = mf.official_tensors("qwen3_moe_tiny", model)  # bf16 cast there; compare in f32 here instead
    sd = model.state_dict()
    for key, want in deq.items():
        if key in sd:
            assert np.array_equal(sd[key].numpy(), want), key
    for layer in range(cfg.num_hidden_layers):
        if layer in cfg.mlp_only_layers:
            continue
        p = f"model.layers.{layer}.mlp.experts."
        gu, dn = sd[p + "gate_up_proj"].numpy(), sd[p + "down_proj"].numpy()
        inter = gu.shape[1] // 2
        for e in range(gu.shape[0]):
            assert np.array_equal(gu[e, :inter], deq[f"{p}{e}.gate_proj.weight"])
            assert np.array_equal(gu[e, inter:], deq[f"{p}{e}.up_proj.weight"])
            assert np.array_equal(dn[e], deq[f"{p}{e}.down_proj.weight"])
    assert set(back) == {k for k in deq}, "official layout round trip lost tensors"
    return model.eval()


def run_case(model, tok, case_name, request, out_dir, special):
    """One chat request through transformers: prompt ids, last-position logits, 16 greedy tokens."""
    prompt = tok.apply_chat_template(request["messages"], tokenize=False, add_generation_prompt=True)
    inputs = tok(prompt, add_special_tokens=False, return_tensors="pt")
    ids = inputs["input_ids"]
    assert int(ids.max()) < VOCAB_SIZE
    store, handles = mf.capture_hidden_states(model, "qwen3_moe_tiny")  # router top-k gaps
    try:
        with torch.no_grad():
            out = model(**inputs, logits_to_keep=1, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    logits = out.logits[0, -1].to(torch.float32)
    np.save(out_dir / f"{case_name}.logits.npy", logits.numpy())
    eos = [special["<|im_end|>"], special["<|endoftext|>"]]
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_STEPS, eos_token_id=eos, pad_token_id=eos[1])
    with torch.no_grad():
        gen = model.generate(**inputs, generation_config=gen_cfg, output_logits=True, return_dict_in_generate=True)
    tokens = gen.sequences[0, ids.shape[1]:].tolist()
    margins = []
    for step, step_logits in enumerate(gen.logits):
        top = step_logits[0].to(torch.float32).topk(2)
        assert int(top.indices[0]) == tokens[step]
        margins.append(float(top.values[0] - top.values[1]))
    assert torch.allclose(gen.logits[0][0].to(torch.float32), logits, atol=1e-4, rtol=0)
    assert len(tokens) == GREEDY_STEPS, f"{case_name}: generation stopped after {len(tokens)} tokens"
    record = {
        "request": request,
        "prompt_text": prompt,
        "prompt_ids": ids[0].tolist(),
        "logits_file": f"{case_name}.logits.npy",
        "greedy_tokens": tokens,
        "greedy_margins": margins,
        "router_min_topk_gap": min(store["router_gaps"]),
        "reference": "transformers Qwen3MoeForCausalLM in float32 on the numpy-dequantized FP8 weights",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "attn_implementation": mf.ATTN_IMPLEMENTATION,
        "experts_implementation": mf.EXPERTS_IMPLEMENTATION,
        "compute_dtype": "float32",
    }
    mf.write_json(out_dir / f"{case_name}.json", record)
    return {"case": case_name, "prompt_tokens": int(ids.shape[1]), "min_margin": min(margins),
            "router_min_topk_gap": record["router_min_topk_gap"]}


def numpy_forward(model_dir, ids):
    """Independent float64 forward that reads the FP8 files directly; last-position logits."""
    cfg = json.loads((model_dir / "config.json").read_text())
    w = {}
    raw = {}
    for f in SHARDS:
        with safetensors.safe_open(str(model_dir / f), framework="pt") as sf:
            for k in sf.keys():
                raw[k] = sf.get_tensor(k)
    for k, t in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            w[k] = dequantize_blocks(t.view(torch.uint8).numpy(), raw[k + "_scale_inv"].numpy()).astype(np.float64)
        else:
            w[k] = t.to(torch.float64).numpy()
    n_heads, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]

    def rms(x, g):
        return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    def silu(a):
        return a / (1 + np.exp(-a))

    t_len = len(ids)
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(t_len, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]
    half = hd // 2

    def rope(x):
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    x = w["model.embed_tokens.weight"][np.asarray(ids)].copy()
    causal = np.triu(np.full((t_len, t_len), -np.inf), 1)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t_len, n_heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t_len, n_kv, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t_len, n_kv, hd)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]))
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]))
        heads = []
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            s = q[:, head] @ k[:, kv].T / math.sqrt(hd) + causal
            s = np.exp(s - s.max(-1, keepdims=True))
            heads.append((s / s.sum(-1, keepdims=True)) @ v[:, kv])
        x = x + np.concatenate(heads, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if layer in cfg["mlp_only_layers"]:
            y = (silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
                @ w[p + "mlp.down_proj.weight"].T
        else:
            r = h @ w[p + "mlp.gate.weight"].T
            prob = np.exp(r - r.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            y = np.zeros_like(h)
            for tok in range(t_len):
                sel = np.argsort(-prob[tok], kind="stable")[:cfg["num_experts_per_tok"]]
                for e, we in zip(sel, prob[tok, sel] / prob[tok, sel].sum()):
                    e_p = f"{p}mlp.experts.{e}."
                    g = w[e_p + "gate_proj.weight"] @ h[tok]
                    u = w[e_p + "up_proj.weight"] @ h[tok]
                    y[tok] += we * (w[e_p + "down_proj.weight"] @ (silu(g) * u))
        x = x + y
    x = rms(x, w["model.norm.weight"])
    return x[-1] @ w["lm_head.weight"].T


def dir_bytes(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def write_readme(out, summary, cases, tables):
    model_dir = out / "models" / NAME
    lines = [
        "# zest FP8 test fixture (generated)",
        "",
        "Everything here is written by `tools/make_fp8_fixtures.py`; do not edit by hand. Regenerate from the",
        "repository root with",
        "",
        "    python3 tools/make_fp8_fixtures.py --out tests/fixtures/fp8",
        "",
        f"Made with transformers {transformers.__version__}, torch {torch.__version__}, safetensors "
        f"{safetensors.__version__}, numpy {np.__version__},",
        f"Python {platform.python_version()}, torch threads 1. The script is seeded; a rerun gives the same bytes.",
        "",
        "## `e4m3_table.npy`",
        "",
        "float32 [256]: torch's `float8_e4m3fn` -> `float32` conversion of every byte (0x7f and 0xff are NaN).",
        "The script checks it against the format definition (1 sign, 4 exponent bits with bias 7, 3 mantissa",
        "bits, subnormals m * 2^-9, S.1111.111 NaN, no infinities).",
        "",
        f"## `models/{NAME}`",
        "",
        "A Qwen3MoeForCausalLM in the format of Qwen's official -FP8 checkpoints (Qwen3-30B-A3B-FP8):",
        "`quantization_config` =",
        "",
        "    " + json.dumps(QUANTIZATION_CONFIG),
        "",
        "- hidden 160, 3 layers (layer 1 a dense SwiGLU MLP of width 200 via `mlp_only_layers`, layers 0 and 2",
        "  MoE with 8 experts top-2, moe_intermediate 48, norm_topk_prob), 4 query / 2 KV heads of 64, untied",
        "  lm_head, vocabulary 1024, rope_theta 1e6. Random weights drawn as in `tools/make_fixtures.py`",
        f"  (seed {SEED}), rounded to bf16, then quantized.",
        "- Every nn.Linear weight is `F8_E4M3` with a `F32` `<name>_scale_inv` [ceil(out/128), ceil(in/128)]:",
        "  per 128x128 block scale_inv = amax / 448 and q = round-to-nearest-even(w / scale_inv) (numpy, checked",
        "  bit for bit against torch's float8_e4m3fn cast). `lm_head`, the routers (`mlp.gate`) and",
        "  `model.layers.2.self_attn.o_proj` are listed in `modules_to_not_convert` and stay bf16, as do the",
        "  embeddings and norms. Experts are stored one tensor each (`mlp.experts.E.{gate,up,down}_proj.weight`).",
        "- Block coverage: q_proj [256, 160] (2 full row blocks, a full and a partial column block), k/v_proj",
        "  [128, 160], o_proj [160, 256], dense gate/up [200, 160] and down [160, 200] (full + partial blocks in",
        "  both directions), experts [48, 160] / [160, 48] (a partial row or column block):",
        f"  {summary['fp8_weights']} FP8 weights, {summary['multi_block_weights']} with more than one block, "
        f"{summary['partial_block_weights']} with a partial block,",
        f"  {summary['full_then_partial_weights']} with a full block followed by a partial one.",
        "- Two shards with `model.safetensors.index.json`; the scales of layer 1 sit in the other shard than their",
        "  weights.",
        "- Tokenizer: Qwen's `tokenizer.json` cut to ids 0..997 (the 256 byte symbols and the first 742 merges,",
        "  which only produce those ids) and Qwen's 26 added tokens renumbered 998..1023 (<|endoftext|> 998,",
        "  <|im_start|> 999, <|im_end|> 1000); same normalizer, pre-tokenizer and decoder. `chat_template.jinja`",
        "  is Qwen3's; generation_config eos [1000, 998].",
        "",
        "## Reference cases (`ref/" + NAME + "/<case>.json`)",
        "",
        "transformers 5.17's own FP8 path cannot be the reference here: loading needs `accelerate` (not",
        "installed) and, more to the point, its `Fp8Dequantize` derives the block as rows // scale_rows and",
        "cols // scale_cols, which is 128 only for sizes below 128 or multiples of it (as all text-decoder",
        "shapes of Qwen's official FP8 checkpoints are). For 160 or 200 it would use blocks of 80 or 100. So the",
        "reference is transformers'",
        "Qwen3MoeForCausalLM in float32 (attention and experts `eager`) on the weights dequantized by the numpy",
        "code of the script: w = f32(e4m3) * scale_inv of the block row // 128, column // 128, one f32 product,",
        "which is what vLLM and DeepSeek's kernels compute. On",
        f"{tables['agree']} seeded weights of sizes transformers' Fp8Dequantize handles ([256, 384], [48, 128],",
        "[128, 64], [384, 24]) it gives the same bits as the numpy code; of the fixture's "
        f"{len(tables['cannot'])} FP8 weights",
        f"(all have a 160 or 200 side) it dequantizes {sum(not same for _, same in tables['cannot'])} differently "
        "(the rest only by the chance of",
        "equal neighbouring scales).",
        "",
        "Fields as in `tests/fixtures/README.md` (request, prompt_text, prompt_ids, logits_file = last-position",
        "logits float32 [1024], greedy_tokens, greedy_margins, router_min_topk_gap).",
        "",
        "| case | prompt tokens | min greedy margin | min router top-k gap |",
        "|---|---|---|---|",
    ]
    for c in cases:
        lines.append(f"| {c['case']} | {c['prompt_tokens']} | {c['min_margin']:.4f} | {c['router_min_topk_gap']:.4f} |")
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()
    lines += [
        "",
        "An independent float64 numpy forward that reads the FP8 files itself reproduces transformers'",
        f"last-position logits to {tables['numpy_diff']:.2g} (max abs).",
        "",
        f"Sizes: model directory {dir_bytes(model_dir)} bytes (tensors {summary['bytes']}), ref "
        f"{dir_bytes(out / 'ref')} bytes, everything but this README {dir_bytes(out)} bytes.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/fp8", help="fixture root (default tests/fixtures/fp8)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    out = Path(args.out).resolve()
    os.chdir(REPO)
    out.mkdir(parents=True, exist_ok=True)

    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    assert np.array_equal(np.isnan(table), np.isnan(E4M3))
    assert np.array_equal(table[~np.isnan(table)], E4M3[~np.isnan(E4M3)].astype(np.float32))
    assert np.array_equal(np.signbit(table), np.signbit(E4M3))
    np.save(out / "e4m3_table.npy", table)

    model_dir = out / "models" / NAME
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    tok_json, special = small_tokenizer()
    cfg = build_config(special)
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()
    mf.randomize(model, SEED)
    tensors = mf.official_tensors("qwen3_moe_tiny", model)
    stored, deq, summary = write_model(model_dir, tensors, tok_json, special)
    write_config(cfg, model_dir)
    summary["bytes"] = int(sum(t.numel() * t.element_size() for t in stored.values()))
    agree, cannot = check_transformers_dequant(stored, deq)
    print(f"transformers' Fp8Dequantize: {agree} weights agree bit for bit; it derives a wrong block size for "
          f"{len(cannot)}, {sum(not same for _, same in cannot)} of which come out different", flush=True)

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ref_dir = out / "ref" / NAME
    if ref_dir.exists():
        shutil.rmtree(ref_dir)
    ref_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        ref_cfg = build_config(special)
        ref_model = load_reference_model(ref_cfg, deq, tmp)
    rows, worst = [], 0.0
    for case_name, messages in mf.TEXT_CASES:
        request = mf.make_request(NAME, messages, None)
        rows.append(run_case(ref_model, tok, case_name, request, ref_dir, special))
        print(f"{NAME}/{case_name}: {rows[-1]}", flush=True)
        rec = json.loads((ref_dir / f"{case_name}.json").read_text())
        got = numpy_forward(model_dir, rec["prompt_ids"])
        want = np.load(ref_dir / rec["logits_file"]).astype(np.float64)
        diff = float(np.abs(got - want).max())
        assert diff < 1e-3, f"{case_name}: numpy forward differs from transformers by {diff}"
        worst = max(worst, diff)
    print(f"float64 numpy forward on the FP8 files matches transformers, max |logit diff| {worst:.3g}", flush=True)
    write_readme(out, summary, rows, {"agree": agree, "cannot": cannot, "numpy_diff": worst})
    print(f"wrote {out} ({dir_bytes(out)} bytes)")


if __name__ == "__main__":
    sys.exit(main())
