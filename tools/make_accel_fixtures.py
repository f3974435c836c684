#!/usr/bin/env python3
"""Records transformers references for zest's VisionZip token pruning and SERE expert-similarity calibration.

Run from the repository root after tools/make_fixtures.py has built the tiny checkpoints:

    /opt/refenv/bin/python tools/make_accel_fixtures.py --out tests/fixtures

VisionZip (tests/fixtures/ref/visionzip/): the VL image cases of qwen3_vl_moe_tiny are run through the
transformers vision tower; the softmax attention of one vision block (post-rotary q and k, per image)
gives each patch the attention mass it receives, every 2x2 merge group gives one LLM-token score, each
image keeps its top tokens (uniform rate), and the language model runs on the pruned prompt (kept
embeddings, kept DeepStack rows, the unpruned M-RoPE positions of the kept tokens).

SERE (tests/fixtures/ref/sere/): the calibration corpus in assets/calibration/ is tokenized file by file
without special-token parsing, the first 256 tokens run through each MoE model as one sequence, every
expert runs on every MoE layer's real (normalised) input, and the expert-by-expert similarity is computed
in float64 for the three metrics of docs/sere.md.

Written from the specification (docs/visionzip.md, docs/sere.md), not from zest's C++ code. Everything is
deterministic (one torch thread); a rerun gives the same bytes.
"""

import argparse
import copy
import json
import math
import os
import platform
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
import torchvision
import transformers
from tokenizers import Tokenizer
from transformers import AutoProcessor, AutoTokenizer, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (tiny-model definitions, cases and the float64 numpy forward)

REPO = mf.REPO
VL_MODEL = "qwen3_vl_moe_tiny"
GREEDY_STEPS = 8
MERGE_GROUP = 4  # spatial_merge_size^2 patches per LLM token

# (case name, source VL case, rate, min_tokens, score layer counted from the end of the tower)
VISIONZIP_CASES = [
    ("vl_doc.r50", "vl_doc", "0.5", 16, -2),
    ("vl_two_images.r50", "vl_two_images", "0.5", 16, -2),
    ("vl_two_images.r30", "vl_two_images", "0.3", 4, -2),
    ("vl_doc.r50.last", "vl_doc", "0.5", 16, -1),
]

CALIBRATION_DIR = REPO / "assets" / "calibration"
# Order matters: the first SERE_TOKENS tokens of the concatenation are used (the short English file and
# the start of the Chinese one, so the reference crosses a file boundary and covers CJK text).
CALIBRATION_FILES = [
    "00_en_zen_of_python.txt",
    "01_zh_python_tutorial.txt",
    "02_en_python_tutorial.txt",
    "03_code_python_bisect.py",
    "04_code_python_fnmatch.py",
    "05_code_zest_sere.cpp",
    "06_en_zest_visionzip.md",
]
SERE_TOKENS = 256
SERE_MODELS = ["qwen3_moe_tiny", "qwen3_vl_moe_tiny"]
METRICS = {
    "frobenius": "d_pq = ||A_p - A_q||_F over the whole [N, H] outputs; sim = 1 - d_pq / max_{p != q} d_pq "
                 "(all 1 if every d is 0)",
    "cosine": "sim = (1 + mean_t cos(A_p[t], A_q[t])) / 2, cos = 0 when either row is all zero",
    "cka": "linear CKA: Xc = A_p - column means over tokens, Yc likewise for A_q; "
           "sim = clamp(||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F), 0, 1), 0 when a centred output is all zero",
}


def write_json(path, obj):
    """Writes JSON with sorted keys and a trailing newline (deterministic bytes)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def f32(x):
    """Rounds a float64 array to float32 and returns it as a (nested) list of Python floats."""
    return np.asarray(x, dtype=np.float32).tolist()


def load_vl_model():
    model = mf.Qwen3VLMoeForConditionalGeneration.from_pretrained(
        str(REPO / "tests" / "fixtures" / "models" / VL_MODEL), dtype=torch.float32,
        attn_implementation=mf.ATTN_IMPLEMENTATION, experts_implementation=mf.EXPERTS_IMPLEMENTATION)
    return model.eval()


# ----------------------------------------------------------------------------------------------
# VisionZip
# ----------------------------------------------------------------------------------------------


class VisionAttentionCapture:
    """Wraps the eager attention function to record q, k (after the 2-D rotary) and the softmax of one block.

    The vision attention calls the function once per image segment (cu_seqlens split), in image order.
    """

    def __init__(self, modeling, target_attn):
        self.modeling = modeling
        self.target = target_attn
        self.calls = []
        self.original = modeling.eager_attention_forward

    def __enter__(self):
        def wrapper(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
            out, weights = self.original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
            if module is self.target:
                assert attention_mask is None
                self.calls.append({"q": query.detach()[0].clone(), "k": key.detach()[0].clone(),
                                   "weights": weights.detach()[0].clone(), "scale": float(scaling)})
            return out, weights

        self.modeling.eager_attention_forward = wrapper
        return self

    def __exit__(self, *exc):
        self.modeling.eager_attention_forward = self.original


def received_attention(q, k, scale):
    """a_j = (1/H) sum_h sum_i softmax_j(scale * q_i . k_j), in float64. q, k: [H, n, d]. Returns [n]."""
    q = q.to(torch.float64)
    k = k.to(torch.float64)
    logits = scale * torch.einsum("hid,hjd->hij", q, k)
    probs = torch.softmax(logits, dim=-1)
    return (probs.sum(dim=1).mean(dim=0)).numpy()


def keep_count(m, rate, min_tokens):
    """k = max(min(M, min_tokens), floor(M * (1 - rate))), the rate read as the exact decimal."""
    return max(min(m, min_tokens), math.floor(m * (1 - Fraction(rate))))


def select_top(scores_f32, k):
    """Indices of the k highest scores (ties to the lower index), ascending."""
    order = sorted(range(len(scores_f32)), key=lambda i: (-scores_f32[i], i))
    return sorted(order[:k])


def build_inputs(proc, request):
    """Renders and processes one VL request exactly as tools/make_fixtures.py does."""
    messages = copy.deepcopy(request["messages"])
    prompt = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    images = [proc.image_processor.fetch_images(str(REPO / p)) for p in mf.request_image_paths(request)]
    return proc(text=[prompt], images=images, return_tensors="pt", **request["mm_processor_kwargs"])


def lm_forward(model, embeds, pos3, visual_mask, deepstack, cache=None):
    """Runs the text model on inputs_embeds [T, D] with M-RoPE positions [3, T]; returns f32 logits [T, V]."""
    out = model.model.language_model(
        input_ids=None, inputs_embeds=embeds[None], position_ids=torch.as_tensor(pos3)[:, None, :],
        visual_pos_masks=None if visual_mask is None else visual_mask[None],
        deepstack_visual_embeds=deepstack, past_key_values=cache, use_cache=cache is not None)
    return model.lm_head(out.last_hidden_state)[0].to(torch.float32)


def prune_and_run(model, input_ids, full_pos, embeds_all, ds_all, kept_rows):
    """Builds the pruned prompt and runs it: last-position logits, greedy tokens, margins.

    kept_rows: global rows of the merged image embeddings that stay, ascending. Returns a dict.
    """
    ids = input_ids[0]
    image_positions = (ids == mf.IMAGE_TOKEN_ID).nonzero()[:, 0]
    assert len(image_positions) == embeds_all.shape[0]
    drop = torch.ones(len(image_positions), dtype=torch.bool)
    drop[kept_rows] = False
    keep_tok = torch.ones(len(ids), dtype=torch.bool)
    keep_tok[image_positions[drop]] = False
    pruned_ids = ids[keep_tok]
    pos = full_pos[:, keep_tok]
    n = len(pruned_ids)
    rope_delta = int(pos.max()) + 1 - n
    visual = pruned_ids == mf.IMAGE_TOKEN_ID
    kept_embeds = embeds_all[kept_rows]
    kept_ds = [d[kept_rows] for d in ds_all]
    with torch.no_grad():
        embeds = model.model.language_model.embed_tokens(pruned_ids).clone()
        embeds[visual] = kept_embeds
        logits = lm_forward(model, embeds, pos, visual, kept_ds)[-1]
        # Greedy decoding with a KV cache; the i-th generated token sits at n + i + rope_delta (all axes).
        cache = DynamicCache(config=model.config.get_text_config())
        step_logits = lm_forward(model, embeds, pos, visual, kept_ds, cache)[-1]
        assert torch.allclose(step_logits, logits, atol=1e-5, rtol=0)
        tokens, margins = [], []
        for i in range(GREEDY_STEPS):
            top = step_logits.topk(2)
            tokens.append(int(top.indices[0]))
            margins.append(float(top.values[0] - top.values[1]))
            if i + 1 == GREEDY_STEPS:
                break
            tok_embed = model.model.language_model.embed_tokens(torch.tensor([tokens[-1]]))
            p = torch.full((3, 1), n + i + rope_delta, dtype=torch.long)
            step_logits = lm_forward(model, tok_embed, p, None, None, cache)[-1]
        # The same tokens fed back without a cache (one forward over prompt + 7 tokens) pick the same argmax.
        full_ids = torch.cat([pruned_ids, torch.tensor(tokens[:-1])])
        full_embeds = model.model.language_model.embed_tokens(full_ids).clone()
        full_embeds[:n][visual] = kept_embeds
        dec_pos = torch.arange(n, n + GREEDY_STEPS - 1) + rope_delta
        full_pos3 = torch.cat([pos, dec_pos[None].expand(3, -1)], dim=1)
        full_visual = torch.cat([visual, torch.zeros(GREEDY_STEPS - 1, dtype=torch.bool)])
        all_logits = lm_forward(model, full_embeds, full_pos3, full_visual, kept_ds)
        assert all_logits[n - 1:].argmax(-1).tolist() == tokens, "cached and uncached greedy tokens differ"
    return {"pruned_ids": pruned_ids.tolist(), "position_ids": pos.tolist(), "rope_delta": rope_delta,
            "logits": logits, "greedy_tokens": tokens, "greedy_margins": margins,
            "kept_embeds": kept_embeds, "kept_deepstack": kept_ds}


def run_visionzip(out_root):
    """Writes tests/fixtures/ref/visionzip/<case>.json + .logits.npy; returns per-case summaries."""
    out_dir = out_root / "ref" / "visionzip"
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = REPO / "tests" / "fixtures" / "models" / VL_MODEL
    model = load_vl_model()
    proc = AutoProcessor.from_pretrained(str(model_dir))
    modeling = sys.modules[type(model).__module__]
    depth = model.config.vision_config.depth
    weights = mf.load_official_weights(model_dir)
    text_cfg = json.loads((model_dir / "config.json").read_text())["text_config"]
    requests = {c: mf.make_request(VL_MODEL, m, k) for c, m, k in mf.VL_CASES}
    summaries = []

    # Sanity check of the pruned-prompt path: keeping every token reproduces the recorded reference.
    for source in sorted({c[1] for c in VISIONZIP_CASES}):
        ref_dir = out_root / "ref" / VL_MODEL
        ref = json.loads((ref_dir / f"{source}.json").read_text())
        inputs = build_inputs(proc, requests[source])
        with torch.no_grad():
            vo = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True)
            full_pos, _ = model.model.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                                     image_grid_thw=inputs["image_grid_thw"])
        embeds_all = torch.cat(list(vo.pooler_output)).to(torch.float32)
        r = prune_and_run(model, inputs["input_ids"], full_pos[:, 0], embeds_all, list(vo.deepstack_features),
                          torch.arange(embeds_all.shape[0]))
        want = torch.from_numpy(np.load(ref_dir / ref["logits_file"]))
        diff = float((r["logits"] - want).abs().max())
        assert r["pruned_ids"] == ref["prompt_ids"] and r["position_ids"] == ref["position_ids"]
        assert diff < 1e-4, f"{source}: unpruned path differs from the recorded logits by {diff}"
        assert r["greedy_tokens"] == ref["greedy_tokens"][:GREEDY_STEPS], source
        print(f"visionzip: {source} unpruned path matches ref/{VL_MODEL} (max |logit diff| {diff:.3g})", flush=True)

    for case, source, rate, min_tokens, layer_from_end in VISIONZIP_CASES:
        request = requests[source]
        inputs = build_inputs(proc, request)
        grid = inputs["image_grid_thw"]
        layer = depth + layer_from_end
        with VisionAttentionCapture(modeling, model.model.visual.blocks[layer].attn) as cap, torch.no_grad():
            vo = model.model.get_image_features(inputs["pixel_values"], grid, return_dict=True)
        assert len(cap.calls) == grid.shape[0], "one attention call per image expected"
        embeds_all = torch.cat(list(vo.pooler_output)).to(torch.float32)
        ds_all = [d.to(torch.float32) for d in vo.deepstack_features]
        patch_scores, token_scores, kept, kept_rows, counts, gaps = [], [], [], [], [], []
        weight_diff, row = 0.0, 0
        for call, (t, gh, gw) in zip(cap.calls, grid.tolist()):
            n_patch = t * gh * gw
            assert call["q"].shape[1] == n_patch
            a = received_attention(call["q"], call["k"], call["scale"])
            assert abs(a.sum() - n_patch) < 1e-9 * n_patch
            # Cross-check: the column sums of the softmax transformers itself computed (float32).
            a_tf = call["weights"].to(torch.float64).sum(dim=1).mean(dim=0).numpy()
            weight_diff = max(weight_diff, float(np.abs(a - a_tf).max()))
            s = a.reshape(-1, MERGE_GROUP).sum(axis=1)
            s32 = np.asarray(s, dtype=np.float32)
            m = len(s32)
            k = keep_count(m, rate, min_tokens)
            sel = select_top(s32.tolist(), k)
            patch_scores.append(f32(a))
            token_scores.append(s32.tolist())
            counts.append(m)
            kept.append(sel)
            ranked = sorted(s32.tolist(), reverse=True)
            gaps.append(float(ranked[k - 1] - ranked[k]) if k < m else None)
            kept_rows.extend(row + j for j in sel)
            row += m
        assert row == embeds_all.shape[0]
        assert weight_diff < 1e-4, f"{case}: score differs from transformers' softmax by {weight_diff}"
        with torch.no_grad():
            full_pos, _ = model.model.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                                     image_grid_thw=grid)
        r = prune_and_run(model, inputs["input_ids"], full_pos[:, 0], embeds_all, ds_all, torch.tensor(kept_rows))
        # Independent float64 numpy decoder (official tensors only) on the pruned prompt.
        np_logits = mf.numpy_text_logits(VL_MODEL, weights, text_cfg, r["pruned_ids"], r["position_ids"],
                                         r["kept_embeds"].double().numpy(),
                                         np.stack([d.double().numpy() for d in r["kept_deepstack"]]))
        np_diff = float(np.abs(np_logits - r["logits"].double().numpy()).max())
        assert np_diff < 1e-3, f"{case}: numpy decoder differs by {np_diff}"

        image_ranges, start = [], None
        for i, tok in enumerate(r["pruned_ids"] + [None]):
            if tok == mf.IMAGE_TOKEN_ID and start is None:
                start = i
            elif tok != mf.IMAGE_TOKEN_ID and start is not None:
                image_ranges.append([start, i])
                start = None
        assert [e - b for b, e in image_ranges] == [len(x) for x in kept]
        np.save(out_dir / f"{case}.logits.npy", r["logits"].numpy())
        record = {
            "case": case,
            "model": VL_MODEL,
            "source_case": f"../{VL_MODEL}/{source}.json",
            "request": request,
            "mode": "uniform",
            "rate": float(rate),
            "min_tokens": min_tokens,
            "score_layer": layer,
            "score_layer_from_end": layer_from_end,
            "vision_depth": depth,
            "score_definition": "per image, at vision block score_layer with post-rotary q, k [heads, n, head_dim] "
                                "and scale head_dim^-0.5: a_j = (1/H) sum_h sum_i softmax_j(scale q_i . k_j) "
                                "(float64); token m score = a_{4m} + a_{4m+1} + a_{4m+2} + a_{4m+3}; stored as f32",
            "image_grid_thw": grid.tolist(),
            "tokens_per_image": counts,
            "patch_scores": patch_scores,
            "token_scores": token_scores,
            "keep_counts": [len(x) for x in kept],
            "kept": kept,
            "kept_rows": kept_rows,
            "selection_gaps": gaps,
            "full_prompt_tokens": int(inputs["input_ids"].shape[1]),
            "prompt_ids": r["pruned_ids"],
            "image_token_ranges": image_ranges,
            "position_ids": r["position_ids"],
            "rope_delta": r["rope_delta"],
            "logits_file": f"{case}.logits.npy",
            "greedy_tokens": r["greedy_tokens"],
            "greedy_margins": r["greedy_margins"],
            "checks": {"softmax_column_sum_max_abs_diff": weight_diff, "numpy_decoder_max_abs_logit_diff": np_diff},
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "torchvision_version": torchvision.__version__,
            "attn_implementation": mf.ATTN_IMPLEMENTATION,
            "experts_implementation": mf.EXPERTS_IMPLEMENTATION,
            "compute_dtype": "float32",
        }
        write_json(out_dir / f"{case}.json", record)
        summary = {"case": case, "tokens_per_image": counts, "keep_counts": record["keep_counts"],
                   "prompt_tokens": len(r["pruned_ids"]), "full_prompt_tokens": record["full_prompt_tokens"],
                   "min_margin": min(r["greedy_margins"]), "min_gap": min(g for g in gaps if g is not None), "numpy_diff": np_diff, "softmax_diff": weight_diff}
        summaries.append(summary)
        print(f"visionzip: {summary}", flush=True)
    return summaries


# ----------------------------------------------------------------------------------------------
# SERE calibration
# ----------------------------------------------------------------------------------------------


def calibration_tokens(n_tokens):
    """Tokenizes each corpus file on its own (no special-token parsing), concatenates, keeps n_tokens ids."""
    tok = Tokenizer.from_file(str(REPO / "assets" / "tokenizer" / "tokenizer.json"))
    tok.encode_special_tokens = True
    hf = AutoTokenizer.from_pretrained(str(REPO / "tests" / "fixtures" / "models" / "qwen3_moe_tiny"))
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    ids, per_file = [], []
    for name in CALIBRATION_FILES:
        text = (CALIBRATION_DIR / name).read_bytes().decode("utf-8")
        assert not any(a in text for a in added), f"{name} contains an added-token string"
        file_ids = tok.encode(text, add_special_tokens=False).ids
        assert file_ids == hf(text, add_special_tokens=False)["input_ids"], name
        per_file.append(len(file_ids))
        ids.extend(file_ids)
    assert len(ids) >= n_tokens
    return ids[:n_tokens], per_file


def expert_outputs(name, w, prefix, layer, x, n_experts):
    """Every expert's SwiGLU output on x [N, H] (float64), from the official checkpoint tensors: [E, N, H]."""
    p = f"{prefix}layers.{layer}.mlp.experts."
    silu = lambda a: a / (1.0 + np.exp(-a))  # noqa: E731
    out = []
    for e in range(n_experts):
        if name == "qwen3_moe_tiny":  # per-expert nn.Linear [out, in]
            g = x @ w[f"{p}{e}.gate_proj.weight"].T
            u = x @ w[f"{p}{e}.up_proj.weight"].T
            out.append((silu(g) * u) @ w[f"{p}{e}.down_proj.weight"].T)
        else:  # fused input-major [E, H, 2I] (gate = first I columns) and [E, I, H]
            gu = x @ w[p + "gate_up_proj"][e]
            inter = gu.shape[1] // 2
            out.append((silu(gu[:, :inter]) * gu[:, inter:]) @ w[p + "down_proj"][e])
    return np.stack(out)


def similarity(a, metric):
    """[E, E] similarity of expert outputs a [E, N, H] (float64), diagonal 1."""
    e_count = a.shape[0]
    s = np.ones((e_count, e_count))
    if metric == "frobenius":
        d = np.zeros((e_count, e_count))
        for p in range(e_count):
            for q in range(e_count):
                d[p, q] = np.sqrt(((a[p] - a[q]) ** 2).sum())
        dmax = max(d[p, q] for p in range(e_count) for q in range(e_count) if p != q)
        if dmax > 0:
            s = 1.0 - d / dmax
    elif metric == "cosine":
        norms = np.sqrt((a * a).sum(-1))  # [E, N]
        for p in range(e_count):
            for q in range(e_count):
                dots = (a[p] * a[q]).sum(-1)
                den = norms[p] * norms[q]
                cos = np.where(den > 0, dots / np.where(den > 0, den, 1.0), 0.0)
                s[p, q] = (1.0 + cos.mean()) / 2.0
    elif metric == "cka":
        c = a - a.mean(axis=1, keepdims=True)
        self_norm = [np.linalg.norm(c[p].T @ c[p]) for p in range(e_count)]
        for p in range(e_count):
            for q in range(e_count):
                den = self_norm[p] * self_norm[q]
                s[p, q] = min(1.0, max(0.0, np.linalg.norm(c[q].T @ c[p]) ** 2 / den)) if den > 0 else 0.0
    else:
        raise ValueError(metric)
    np.fill_diagonal(s, 1.0)
    return s


def run_sere(out_root):
    """Writes tests/fixtures/ref/sere/<model>.<metric>.npy and <model>.json; returns summaries."""
    out_dir = out_root / "ref" / "sere"
    out_dir.mkdir(parents=True, exist_ok=True)
    ids, per_file = calibration_tokens(SERE_TOKENS)
    summaries = {}
    for name in SERE_MODELS:
        model_dir = REPO / "tests" / "fixtures" / "models" / name
        if name == "qwen3_vl_moe_tiny":
            model = load_vl_model()
            lm = model.model.language_model
        else:
            model = mf.Qwen3MoeForCausalLM.from_pretrained(
                str(model_dir), dtype=torch.float32, attn_implementation=mf.ATTN_IMPLEMENTATION,
                experts_implementation=mf.EXPERTS_IMPLEMENTATION).eval()
            lm = model.model
        cfg = json.loads((model_dir / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        prefix = "model." if name == "qwen3_moe_tiny" else "model.language_model."
        w = mf.load_official_weights(model_dir)
        captured, moe_out, handles = {}, {}, []
        for layer_idx, layer in enumerate(lm.layers):
            handles.append(layer.post_attention_layernorm.register_forward_hook(
                lambda _m, _i, o, li=layer_idx: captured.__setitem__(li, o.detach()[0].clone())))
            handles.append(layer.mlp.register_forward_hook(
                lambda _m, _i, o, li=layer_idx: moe_out.__setitem__(li, (o[0] if isinstance(o, tuple) else o)
                                                                    .detach()[0].clone())))
        try:
            with torch.no_grad():
                lm(input_ids=torch.tensor([ids]), use_cache=False)  # positions 0..N-1, no template
        finally:
            for h in handles:
                h.remove()
        n_layers, n_experts, top_k = cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"]
        sims = {m: [] for m in METRICS}
        recon = 0.0
        for layer in range(n_layers):
            x = captured[layer].to(torch.float64).numpy()
            assert x.shape == (SERE_TOKENS, cfg["hidden_size"])
            a = expert_outputs(name, w, prefix, layer, x, n_experts)
            # The routed mixture of these outputs must be what transformers' MoE block returned.
            r = x @ w[f"{prefix}layers.{layer}.mlp.gate.weight"].T
            prob = np.exp(r - r.max(-1, keepdims=True))
            prob /= prob.sum(-1, keepdims=True)
            y = np.zeros_like(x)
            for t in range(SERE_TOKENS):
                sel = np.argsort(-prob[t], kind="stable")[:top_k]
                for e, we in zip(sel, prob[t, sel] / prob[t, sel].sum()):
                    y[t] += we * a[e, t]
            recon = max(recon, float(np.abs(y - moe_out[layer].to(torch.float64).numpy()).max()))
            for m in METRICS:
                sims[m].append(similarity(a, m))
        assert recon < 1e-4, f"{name}: routed expert mixture differs from transformers by {recon}"
        files = {}
        for m in METRICS:
            arr = np.stack(sims[m]).astype(np.float32)
            assert np.allclose(arr, arr.transpose(0, 2, 1)) and (arr >= 0).all() and (arr <= 1).all()
            np.save(out_dir / f"{name}.{m}.npy", arr)
            files[m] = f"{name}.{m}.npy"
        record = {
            "model": name,
            "corpus_files": [f"assets/calibration/{f}" for f in CALIBRATION_FILES],
            "tokenization": "each file on its own: tokenizer.json, NFC, no special-token parsing "
                            "(tokenizers encode_special_tokens = True), no BOS/EOS; ids concatenated in file order",
            "file_token_counts": per_file,
            "n_tokens": SERE_TOKENS,
            "token_ids": ids,
            "positions": "0..N-1 on every M-RoPE axis, one sequence, no chat template",
            "moe_layers": list(range(n_layers)),
            "n_experts": n_experts,
            "hidden_size": cfg["hidden_size"],
            "expert_input": "post_attention_layernorm output of each decoder layer, all N tokens (float32 forward)",
            "expert_output": "A_e = down(silu(gate x) * up x), every expert on every token, no routing weights "
                             "(float64 from the official checkpoint tensors)",
            "similarity_dtype": "computed in float64, stored float32 [layers, E, E], row p column q, symmetric",
            "metrics": {m: {"file": files[m], "definition": METRICS[m]} for m in METRICS},
            "checks": {"routed_mixture_vs_transformers_moe_max_abs_diff": recon},
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "attn_implementation": mf.ATTN_IMPLEMENTATION,
            "compute_dtype": "float32",
        }
        write_json(out_dir / f"{name}.json", record)
        summaries[name] = {"routed_mixture_diff": recon,
                           **{f"{m}_offdiag_mean": float(np.mean([s[~np.eye(n_experts, dtype=bool)].mean()
                                                                  for s in sims[m]])) for m in METRICS}}
        print(f"sere: {name} {summaries[name]}", flush=True)
    return summaries, per_file


# ----------------------------------------------------------------------------------------------


VISIONZIP_SCHEMA = [
    ("case, model, source_case", "case name, `qwen3_vl_moe_tiny`, the unpruned reference case (relative path)"),
    ("request", "the OpenAI request body of the source case (same `mm_processor_kwargs`)"),
    ("mode, rate, min_tokens", "`uniform`; k_i = max(min(M_i, min_tokens), floor(M_i * (1 - rate))), the rate "
                               "read as the exact decimal"),
    ("score_layer, score_layer_from_end, vision_depth", "the vision block whose attention is scored (0-based), "
                                                         "the same counted from the end (-2 = second-to-last)"),
    ("score_definition", "how the scores were computed (text)"),
    ("image_grid_thw, tokens_per_image", "patch grid per image and M_i = t*h*w/4 LLM tokens per image"),
    ("patch_scores", "per image: a_j for every patch in tower order (f32 list, sums to the patch count)"),
    ("token_scores", "per image: s_m = sum of the 4 patch scores of merge group m (f32 list of M_i)"),
    ("keep_counts, kept", "per image: k_i and the kept image-local token indices (top k_i by token_scores, ties "
                          "to the lower index, ascending)"),
    ("selection_gaps", "per image: k_i-th highest minus (k_i+1)-th highest token score (null when nothing is "
                       "dropped): how far a recomputed score may move before the kept set changes"),
    ("kept_rows", "the kept rows of the source case's `vision_embeds.npy` / `deepstack.npy` (global, ascending)"),
    ("full_prompt_tokens", "prompt length before pruning"),
    ("prompt_ids", "the pruned prompt: each image keeps k_i `<|image_pad|>` tokens"),
    ("image_token_ranges", "per image: [begin, end) of its `<|image_pad|>` run in the pruned prompt"),
    ("position_ids", "3 x T' M-RoPE ids: the unpruned `get_rope_index` ids with the pruned image columns removed"),
    ("rope_delta", "max position + 1 - T'; the i-th generated token (0-based), fed back, sits at T' + i + rope_delta"),
    ("logits_file", "`<case>.logits.npy`, float32 [151936]: last-position logits of the pruned prompt"),
    ("greedy_tokens, greedy_margins", f"{GREEDY_STEPS} greedy tokens (KV cache, positions from rope_delta) and "
                                      "the top-1 minus top-2 logit at each step"),
    ("checks", "`softmax_column_sum_max_abs_diff` (float64 scores vs transformers' float32 softmax), "
               "`numpy_decoder_max_abs_logit_diff` (independent float64 numpy decoder on the pruned prompt)"),
    ("versions, attn_implementation, experts_implementation, compute_dtype", "how transformers ran"),
]


def write_readmes(out_root, vz, sere, per_file):
    env = (f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
           f"Python {platform.python_version()}, torch threads 1")
    lines = ["# VisionZip references (generated)", "",
             "Written by `tools/make_accel_fixtures.py` (regenerate: `/opt/refenv/bin/python "
             "tools/make_accel_fixtures.py --out tests/fixtures`); do not edit by hand. Made with " + env + ".", "",
             "Uniform VisionZip pruning of the `qwen3_vl_moe_tiny` image cases: scores from the transformers vision "
             "tower (eager attention, post-rotary q and k captured per image at the score block), per-image top-k, "
             "then the language model on the pruned prompt (kept merger embeddings, kept DeepStack rows, the "
             "unpruned M-RoPE ids of the kept tokens). Before the cases the script checks that keeping every token "
             "reproduces `ref/qwen3_vl_moe_tiny/<source>.json` (logits and greedy tokens).", "",
             "| case | rate | min_tokens | score layer | M_i | k_i | min selection gap | prompt tokens (full) "
             "| min greedy margin |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s, c in zip(vz, VISIONZIP_CASES):
        lines.append(f"| {s['case']} | {c[2]} | {c[3]} | {c[4]} | {s['tokens_per_image']} | {s['keep_counts']} | "
                     f"{s['min_gap']:.4f} | {s['prompt_tokens']} ({s['full_prompt_tokens']}) | {s['min_margin']:.4f} |")
    lines += ["", "Fields of `<case>.json` (paths relative to this directory):", ""]
    lines += [f"- `{k}`: {v}" for k, v in VISIONZIP_SCHEMA]
    (out_root / "ref" / "visionzip" / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    lines = ["# SERE calibration references (generated)", "",
             "Written by `tools/make_accel_fixtures.py`; do not edit by hand. Made with " + env + ".", "",
             f"Corpus: `assets/calibration/` files in this order (token counts per file): "
             + ", ".join(f"`{f}` ({n})" for f, n in zip(CALIBRATION_FILES, per_file))
             + f". The first {SERE_TOKENS} ids of the per-file tokenization run through each model as one sequence "
             "(float32, eager attention); each MoE layer's `post_attention_layernorm` output is the expert input.", "",
             "Files: `<model>.json` (token ids, corpus list, definitions, checks) and `<model>.<metric>.npy`, "
             "float32 [layers, E, E] for metric in frobenius, cosine, cka (computed in float64, diagonal 1):", ""]
    lines += [f"- `{m}`: {d}" for m, d in METRICS.items()]
    lines += ["", "| model | routed-mixture check (max abs diff) | mean off-diagonal frobenius | cosine | cka |",
              "|---|---|---|---|---|"]
    for name, s in sere.items():
        lines.append(f"| {name} | {s['routed_mixture_diff']:.2g} | {s['frobenius_offdiag_mean']:.4f} | "
                     f"{s['cosine_offdiag_mean']:.4f} | {s['cka_offdiag_mean']:.4f} |")
    (out_root / "ref" / "sere" / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures", help="fixture root (default tests/fixtures)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    out_root = Path(args.out).resolve()
    os.chdir(REPO)
    sere, per_file = run_sere(out_root)
    vz = run_visionzip(out_root)
    write_readmes(out_root, vz, sere, per_file)
    print(f"wrote {out_root / 'ref' / 'visionzip'} and {out_root / 'ref' / 'sere'}")


if __name__ == "__main__":
    sys.exit(main())
