#!/usr/bin/env python3
"""Builds zest's tiny reference checkpoints and records Hugging Face transformers' outputs for them.

Run from the repository root:

    /opt/refenv/bin/python tools/make_fixtures.py --out tests/fixtures

Three tiny models with random weights are written in the official Hugging Face checkpoint layouts
(tests/fixtures/models/<name>/), each is loaded back with transformers and compared tensor by tensor,
and then every reference case (an OpenAI chat-completions request) is run through transformers in
float32 on the bf16-representable weights (tests/fixtures/ref/<name>/<case>.json + .npy files).
Everything is seeded; running the script twice gives identical files.
"""

import argparse
import copy
import json
import math
import os
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import safetensors.torch
import torch
import torchvision
import transformers
from transformers import (
    AutoConfig,
    AutoProcessor,
    AutoTokenizer,
    GenerationConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "assets" / "tokenizer"

VOCAB_SIZE = 151936
BOS_ID = 151643  # <|endoftext|>
EOS_IDS = [151645, 151643]  # <|im_end|>, <|endoftext|>
IMAGE_TOKEN_ID = 151655
GREEDY_STEPS = 16
ATTN_IMPLEMENTATION = "eager"
EXPERTS_IMPLEMENTATION = "eager"

# Pixel budgets of the VL cases (min_pixels, max_pixels); one LLM token per 32x32 pixels.
TOKEN_PIXELS = 32 * 32


# ----------------------------------------------------------------------------------------------
# Model definitions
# ----------------------------------------------------------------------------------------------

TEXT_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_act="silu",
    rms_norm_eps=1e-6,
    attention_bias=False,
    max_position_embeddings=4096,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_IDS[0],
)

VISION = dict(
    depth=3,
    hidden_size=32,
    num_heads=2,
    intermediate_size=48,
    hidden_act="gelu_pytorch_tanh",
    in_channels=3,
    patch_size=16,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=64,
    out_hidden_size=16,
    deepstack_visual_indexes=[0, 1],
)

MROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}


def build_config(name):
    """Returns the transformers config of one fixture model."""
    if name == "qwen3_moe_tiny":
        cfg = Qwen3MoeConfig(
            **TEXT_COMMON,
            intermediate_size=40,
            moe_intermediate_size=24,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
        cfg.architectures = ["Qwen3MoeForCausalLM"]
    elif name == "qwen3_tiny":
        cfg = Qwen3Config(
            **TEXT_COMMON,
            intermediate_size=40,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
        cfg.architectures = ["Qwen3ForCausalLM"]
    elif name == "qwen3_vl_moe_tiny":
        text = dict(
            TEXT_COMMON,
            intermediate_size=40,
            moe_intermediate_size=24,
            num_experts=16,
            num_experts_per_tok=4,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            tie_word_embeddings=False,
            rope_parameters=dict(MROPE),
        )
        cfg = Qwen3VLMoeConfig(text_config=text, vision_config=dict(VISION), tie_word_embeddings=False)
        cfg.architectures = ["Qwen3VLMoeForConditionalGeneration"]
    elif name == "qwen3_vl_tiny":
        text = dict(TEXT_COMMON, intermediate_size=40, tie_word_embeddings=True, rope_parameters=dict(MROPE))
        cfg = Qwen3VLConfig(text_config=text, vision_config=dict(VISION), tie_word_embeddings=True)
        cfg.architectures = ["Qwen3VLForConditionalGeneration"]
    else:
        raise ValueError(name)
    cfg.dtype = torch.bfloat16
    for sub in ("text_config", "vision_config"):
        if hasattr(cfg, sub):
            getattr(cfg, sub).dtype = torch.bfloat16
    return cfg


MODEL_CLASSES = {
    "qwen3_moe_tiny": Qwen3MoeForCausalLM,
    "qwen3_vl_moe_tiny": Qwen3VLMoeForConditionalGeneration,
    "qwen3_vl_tiny": Qwen3VLForConditionalGeneration,
    "qwen3_tiny": Qwen3ForCausalLM,
}
MODEL_SEEDS = {"qwen3_moe_tiny": 1001, "qwen3_vl_moe_tiny": 2002, "qwen3_vl_tiny": 3003, "qwen3_tiny": 4004}
VL_MODELS = ("qwen3_vl_moe_tiny", "qwen3_vl_tiny")
TEXT_MODELS = ("qwen3_moe_tiny", "qwen3_tiny")
DENSE_MODELS = ("qwen3_vl_tiny", "qwen3_tiny")


def bf16_round(t):
    """Rounds a float32 tensor to the nearest bf16 value (kept in float32)."""
    return t.to(torch.bfloat16).to(torch.float32)


def randomize(model, seed):
    """Draws every parameter from a seeded generator with O(1)-activation scales, rounded to bf16."""
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    for name in sorted(params):
        p = params[name]
        shape = tuple(p.shape)
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        is_norm = "norm" in name
        if name.endswith(".bias"):
            v = 0.1 * z
        elif is_norm:
            v = 1.0 + 0.1 * z
        elif name.endswith("embed_tokens.weight"):
            v = z
        elif name.endswith("pos_embed.weight"):
            v = 0.5 * z
        elif name == "lm_head.weight":
            v = z * (2.0 / math.sqrt(shape[1]))
        elif name.endswith("mlp.gate.weight"):
            # MoE router [E, H]: larger scale so top-k routing is decisive.
            v = z * (3.0 / math.sqrt(shape[1]))
        elif name.endswith("patch_embed.proj.weight"):
            v = z / math.sqrt(int(np.prod(shape[1:])))
        elif len(shape) >= 2:
            # nn.Linear [out, in] and transformers' fused experts [E, out, in]: fan_in is the last dim.
            v = z / math.sqrt(shape[-1])
        else:
            raise AssertionError(f"no init rule for {name} {shape}")
        with torch.no_grad():
            p.copy_(bf16_round(v))


# ----------------------------------------------------------------------------------------------
# Official checkpoint layouts
# ----------------------------------------------------------------------------------------------


def official_tensors(name, model):
    """Maps transformers' in-memory parameters to the tensors of the official checkpoint (bf16)."""
    sd = model.state_dict()
    tied = bool(model.config.tie_word_embeddings)
    out = {}
    for key, t in sd.items():
        if tied and key == "lm_head.weight":
            continue
        if name == "qwen3_moe_tiny" and key.endswith("mlp.experts.gate_up_proj"):
            # transformers [E, 2I, H] (gate rows first) -> per-expert nn.Linear [I, H].
            prefix = key[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter, :]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:, :]
        elif name == "qwen3_moe_tiny" and key.endswith("mlp.experts.down_proj"):
            # transformers [E, H, I] -> per-expert nn.Linear [H, I].
            prefix = key[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        elif name == "qwen3_vl_moe_tiny" and key.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            # transformers [E, out, in] -> official input-major [E, in, out]:
            # gate_up_proj [E, H, 2I] (gate = first I columns), down_proj [E, I, H].
            out[key] = t.transpose(1, 2)
        else:
            out[key] = t
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def layer_of(key):
    """Returns the decoder layer index named in a tensor key, or None."""
    parts = key.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers":
            return int(parts[i + 1])
    return None


def save_weights(name, tensors, model_dir):
    """Writes the safetensors file(s); the text MoE model is sharded in two with an index."""
    meta = {"format": "pt"}
    if name != "qwen3_moe_tiny":
        safetensors.torch.save_file(tensors, str(model_dir / "model.safetensors"), metadata=meta)
        return
    shard_names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    shards = [{}, {}]
    for key in sorted(tensors):
        layer = layer_of(key)
        first = key == "model.embed_tokens.weight" or (layer is not None and layer < 2)
        shards[0 if first else 1][key] = tensors[key]
    weight_map = {}
    for shard_name, shard in zip(shard_names, shards):
        safetensors.torch.save_file(shard, str(model_dir / shard_name), metadata=meta)
        for key in shard:
            weight_map[key] = shard_name
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    write_json(model_dir / "model.safetensors.index.json", index)


# ----------------------------------------------------------------------------------------------
# Model directory files
# ----------------------------------------------------------------------------------------------


def write_json(path, obj):
    """Writes JSON with sorted keys and a trailing newline (deterministic bytes)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write_config(name, cfg, model_dir):
    """Writes config.json as transformers writes it, plus the keys real Qwen checkpoints carry."""
    cfg.save_pretrained(str(model_dir))
    path = model_dir / "config.json"
    d = json.loads(path.read_text())
    added = []

    def put(section, key, value):
        if key not in section:
            section[key] = value
            added.append(key)

    if name in TEXT_MODELS:
        if name == "qwen3_moe_tiny":
            put(d, "num_experts", d["num_local_experts"])
        put(d, "rope_theta", d["rope_parameters"]["rope_theta"])
        put(d, "rope_scaling", None)
        put(d, "max_window_layers", d["num_hidden_layers"])
        put(d, "use_sliding_window", False)
        put(d, "torch_dtype", "bfloat16")
    else:
        tc = d["text_config"]
        rp = tc["rope_parameters"]
        put(tc, "rope_theta", rp["rope_theta"])
        put(tc, "rope_scaling", {k: rp[k] for k in ("mrope_interleaved", "mrope_section", "rope_type")})
        if name == "qwen3_vl_moe_tiny":
            put(tc, "num_experts", tc["num_local_experts"])
            put(tc, "norm_topk_prob", True)
    write_json(path, d)
    # The augmented file must mean the same thing to transformers.
    loaded = AutoConfig.from_pretrained(str(model_dir)).to_dict()
    assert_same_config(cfg.to_dict(), loaded, name)
    return sorted(set(added))


def assert_same_config(want, got, where):
    """Checks that every key transformers wrote loads back with the same value."""
    for k, v in want.items():
        if k in ("transformers_version", "_name_or_path"):
            continue
        if isinstance(v, dict) and isinstance(got.get(k), dict):
            assert_same_config(v, got[k], f"{where}.{k}")
        elif got.get(k) != v:
            raise AssertionError(f"config {where}.{k}: wrote {v!r}, transformers reads {got.get(k)!r}")


GENERATION_CONFIGS = {
    # Qwen/Qwen3-30B-A3B and Qwen/Qwen3-8B generation_config.json values.
    "qwen3_moe_tiny": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    "qwen3_tiny": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    # Qwen/Qwen3-VL-*-Instruct generation_config.json values.
    "qwen3_vl_moe_tiny": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.0},
    "qwen3_vl_tiny": {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.0},
}


def write_generation_config(name, model_dir):
    """Writes generation_config.json with Qwen's sampling defaults and stop ids."""
    d = {"bos_token_id": BOS_ID, "pad_token_id": BOS_ID, "do_sample": True, "eos_token_id": list(EOS_IDS)}
    d.update(GENERATION_CONFIGS[name])
    d["transformers_version"] = transformers.__version__
    write_json(model_dir / "generation_config.json", d)


def write_tokenizer_files(name, model_dir):
    """Links tokenizer.json, writes a small tokenizer_config.json and copies the chat template."""
    link = model_dir / "tokenizer.json"
    target = os.path.relpath(TOKENIZER_DIR / "tokenizer.json", model_dir)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)
    src = json.loads((TOKENIZER_DIR / "tokenizer_config.qwen3-4b.json").read_text())
    cfg = {k: v for k, v in src.items() if k not in ("added_tokens_decoder", "chat_template")}
    if name in VL_MODELS:
        cfg["model_max_length"] = 262144
    write_json(model_dir / "tokenizer_config.json", cfg)
    template = "chat_template.qwen3-vl-instruct.jinja" if name in VL_MODELS else "chat_template.qwen3.jinja"
    shutil.copyfile(TOKENIZER_DIR / template, model_dir / "chat_template.jinja")


PREPROCESSOR_CONFIG = {
    # Qwen/Qwen3-VL-* preprocessor_config.json values.
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}


def build_model_dir(name, model_dir):
    """Creates one fixture model directory and returns the model loaded back by transformers."""
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    cfg = build_config(name)
    cls = MODEL_CLASSES[name]
    model = cls(cfg).to(torch.float32).eval()
    randomize(model, MODEL_SEEDS[name])
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    tensors = official_tensors(name, model)
    save_weights(name, tensors, model_dir)
    added_config_keys = write_config(name, cfg, model_dir)
    write_generation_config(name, model_dir)
    write_tokenizer_files(name, model_dir)
    if name in VL_MODELS:
        write_json(model_dir / "preprocessor_config.json", PREPROCESSOR_CONFIG)

    loaded, info = cls.from_pretrained(
        str(model_dir),
        dtype=torch.float32,
        attn_implementation=ATTN_IMPLEMENTATION,
        experts_implementation=EXPERTS_IMPLEMENTATION,
        output_loading_info=True,
    )
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(k), f"{name}: {k} = {info.get(k)}"
    want = model.state_dict()
    got = loaded.state_dict()
    assert sorted(want) == sorted(got), f"{name}: parameter names differ after reload"
    for key in want:
        assert want[key].dtype == got[key].dtype == torch.float32, key
        assert torch.equal(want[key], got[key]), f"{name}: {key} differs after reload"
    if cfg.tie_word_embeddings:
        assert torch.equal(loaded.lm_head.weight, loaded.get_input_embeddings().weight)
    loaded.eval()
    summary = {
        "tensors": len(tensors),
        "parameters": int(sum(t.numel() for t in tensors.values())),
        "bytes": int(sum(t.numel() * t.element_size() for t in tensors.values())),
        "added_config_keys": added_config_keys,
    }
    return loaded, summary


# ----------------------------------------------------------------------------------------------
# Reference cases
# ----------------------------------------------------------------------------------------------


def image_part(file_name):
    return {"type": "image_url", "image_url": {"url": f"file://assets/images/{file_name}"}}


def text_part(text):
    return {"type": "text", "text": text}


TEXT_CASES = [
    ("short", [{"role": "user", "content": "Hello! What is the capital of France?"}]),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Give me three colors."},
            {"role": "assistant", "content": "<think>\nThe user wants colors.\n</think>\n\nRed, green and blue."},
            {"role": "user", "content": "Now name one more, please."},
        ],
    ),
    (
        "system_zh",
        [
            {"role": "system", "content": "你是一个乐于助人的助手。"},
            {"role": "user", "content": "请用一句话介绍一下长城。"},
        ],
    ),
]

VL_CASES = [
    (
        "vl_doc",
        [{"role": "user", "content": [image_part("doc_newspaper_nyt1969.jpg"),
                                      text_part("What is the main headline on this page?")]}],
        {"min_pixels": 4 * TOKEN_PIXELS, "max_pixels": 128 * TOKEN_PIXELS},
    ),
    (
        "vl_two_images",
        [{"role": "user", "content": [text_part("Compare the two images."),
                                      image_part("chart_line_pew_pena_nieto.png"),
                                      image_part("photo_street.jpg"),
                                      text_part("Which one is a chart?")]}],
        # The chart (314x281) is smaller than min_pixels and gets upscaled; the photo is downscaled.
        {"min_pixels": 96 * TOKEN_PIXELS, "max_pixels": 128 * TOKEN_PIXELS},
    ),
    (
        "vl_image_each_turn",
        [
            {"role": "user", "content": [image_part("ticket_bus_zh.jpg"), text_part("这张车票是从哪里到哪里？")]},
            {"role": "assistant", "content": "这是一张从北京到天津的汽车票。"},
            {"role": "user", "content": [image_part("chart_line_pew_china.png"),
                                         text_part("What trend does this chart show?")]},
        ],
        # The chart (422x359) only gets rounded to 416x352; the ticket is downscaled.
        {"min_pixels": 4 * TOKEN_PIXELS, "max_pixels": 160 * TOKEN_PIXELS},
    ),
    (
        "vl_text_only",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [text_part("Describe a sunset in one sentence.")]},
        ],
        None,
    ),
]


def make_request(model_name, messages, mm_kwargs):
    """Returns the OpenAI chat-completions request body of one case."""
    req = {"model": model_name, "messages": messages, "max_tokens": GREEDY_STEPS, "temperature": 0.0}
    if mm_kwargs is not None:
        req["mm_processor_kwargs"] = dict(mm_kwargs)
    return req


def request_image_paths(request):
    """Lists the repo-relative paths of the request's images in prompt order."""
    paths = []
    for msg in request["messages"]:
        if isinstance(msg["content"], str):
            continue
        for part in msg["content"]:
            if part.get("type") == "image_url":
                url = part["image_url"]["url"]
                assert url.startswith("file://"), url
                paths.append(url[len("file://"):])
    return paths


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """Qwen2-VL smart_resize (independent copy, used to cross-check the processor's grids)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def pixel_rows_to_image(rows, grid_h, grid_w):
    """Inverts the processor's patchify: [gh*gw, 1536] f32 rows -> resized uint8 image [H, W, 3]."""
    x = rows.reshape(grid_h // 2, grid_w // 2, 2, 2, 3, 2, 16, 16)  # br, bc, ir, ic, ch, tt, py, px
    assert torch.equal(x[:, :, :, :, :, 0], x[:, :, :, :, :, 1]), "temporal copies differ"
    u = x[:, :, :, :, :, 0] * 127.5 + 127.5
    ur = u.round()
    assert float((u - ur).abs().max()) < 1e-3, "pixel values are not (u - 127.5) / 127.5 of a uint8 image"
    img = ur.permute(0, 2, 5, 1, 3, 6, 4).reshape(grid_h * 16, grid_w * 16, 3)  # br, ir, py, bc, ic, px, ch
    return img.to(torch.uint8).numpy()


def f32_list(t):
    """Converts a float tensor to nested lists of exactly representable float32 values."""
    return t.detach().to(torch.float32).tolist()


def capture_hidden_states(model, name):
    """Registers hooks recording the residual stream entering each decoder layer and the final norm."""
    lm = model.model if name in TEXT_MODELS else model.model.language_model
    store = {"layers": [], "router_gaps": []}
    handles = []

    def pre_hook(_module, args, kwargs):
        hs = args[0] if args else kwargs["hidden_states"]
        store["layers"].append(hs.detach()[0].clone())

    for layer in lm.layers:
        handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            k = gate.top_k

            def gate_hook(_module, _inputs, output, k=k):
                logits = output[0].detach().to(torch.float32)
                top = logits.topk(k + 1, dim=-1).values
                store["router_gaps"].append(float((top[:, k - 1] - top[:, k]).min()))

            handles.append(gate.register_forward_hook(gate_hook))
    handles.append(lm.norm.register_forward_pre_hook(pre_hook, with_kwargs=True))
    return store, handles


def run_case(model, name, proc_or_tok, case_name, request, out_dir, preprocess_dir):
    """Runs one request through transformers and writes <case>.json and its .npy files."""
    is_vl = name in VL_MODELS
    messages = copy.deepcopy(request["messages"])  # apply_chat_template rewrites image parts in place
    mm_kwargs = request.get("mm_processor_kwargs") or {}
    record = {"request": request}
    if is_vl:
        model.model.rope_deltas = None  # transformers caches the M-RoPE delta on the module
        proc = proc_or_tok
        prompt = proc.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        paths = request_image_paths(request)
        images = [proc.image_processor.fetch_images(str(REPO / p)) for p in paths]
        inputs = proc(text=[prompt], images=images or None, return_tensors="pt", **mm_kwargs)
        record["image_processor"] = {
            "class": type(proc.image_processor).__name__,
            "backend": proc.image_processor.backend,
            "image_loader": "transformers.image_utils.load_image_as_tensor (torchvision.io.decode_image, RGB)",
            "resize": "torchvision.transforms.v2.functional.resize(uint8, BICUBIC, antialias=True)",
        }
    else:
        tok = proc_or_tok
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = tok(prompt, add_special_tokens=False, return_tensors="pt")
        images = []
    record["prompt_text"] = prompt
    input_ids = inputs["input_ids"]
    record["prompt_ids"] = input_ids[0].tolist()
    seq_len = input_ids.shape[1]

    if is_vl and images:
        grid = inputs["image_grid_thw"]
        pv = inputs["pixel_values"].to(torch.float32)
        record["image_grid_thw"] = grid.tolist()
        record["pixel_values_rows"] = int(pv.shape[0])
        record["pixel_values_cols"] = int(pv.shape[1])
        record["pixel_values_head"] = f32_list(pv[:4])
        record["pixel_values_sum"] = float(pv.double().sum())
        record["pixel_values_abs_sum"] = float(pv.double().abs().sum())
        blocks, image_info, resized_files = [], [], []
        start = 0
        for k, (path, img, g) in enumerate(zip(request_image_paths(request), images, grid.tolist())):
            t, gh, gw = g
            rows = t * gh * gw
            block = pv[start:start + rows]
            blocks.append({"image": k, "row_begin": start, "row_end": start + rows,
                           "sum": float(block.double().sum()), "abs_sum": float(block.double().abs().sum())})
            height, width = int(img.shape[1]), int(img.shape[2])
            rh, rw = smart_resize(height, width, 32, mm_kwargs["min_pixels"], mm_kwargs["max_pixels"])
            assert (gh * 16, gw * 16) == (rh, rw), f"{case_name}: grid {g} vs smart_resize {(rh, rw)}"
            n_tokens = gh * gw // 4
            assert record["prompt_ids"].count(IMAGE_TOKEN_ID) >= n_tokens
            resized = pixel_rows_to_image(block, gh, gw)
            rel = f"{case_name}.image{k}.u8.npy"
            target = preprocess_dir / rel
            if target.exists():
                assert np.array_equal(np.load(target), resized), f"{rel}: differs between VL models"
            else:
                np.save(target, resized)
            resized_files.append(os.path.relpath(target, out_dir))
            image_info.append({"path": path, "decoded_height": height, "decoded_width": width,
                               "decoded_u8_sum": int(img.to(torch.int64).sum()),
                               "resized_height": rh, "resized_width": rw, "llm_tokens": n_tokens})
            start += rows
        assert start == pv.shape[0]
        record["pixel_values_blocks"] = blocks
        record["images"] = image_info
        record["resized_images"] = resized_files
        assert record["prompt_ids"].count(IMAGE_TOKEN_ID) == sum(i["llm_tokens"] for i in image_info)

        with torch.no_grad():
            vo = model.model.get_image_features(inputs["pixel_values"], grid, return_dict=True)
        embeds = torch.cat(list(vo.pooler_output), dim=0).to(torch.float32)
        record["vision_embeds_rows"] = int(embeds.shape[0])
        record["vision_embeds_head"] = f32_list(embeds[:4])
        sums, start = [], 0
        for part in vo.pooler_output:
            sums.append({"rows": int(part.shape[0]), "sum": float(part.double().sum()),
                         "abs_sum": float(part.double().abs().sum())})
        record["vision_embeds_sums"] = sums
        ds = torch.stack([d.to(torch.float32) for d in vo.deepstack_features])
        record["deepstack_head"] = [f32_list(d[:2]) for d in ds]
        record["deepstack_sums"] = [{"sum": float(d.double().sum()), "abs_sum": float(d.double().abs().sum())}
                                    for d in ds]
        np.save(out_dir / f"{case_name}.vision_embeds.npy", embeds.numpy())
        np.save(out_dir / f"{case_name}.deepstack.npy", ds.numpy())
        record["vision_embeds_file"] = f"{case_name}.vision_embeds.npy"
        record["deepstack_file"] = f"{case_name}.deepstack.npy"

    if is_vl:
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(
                input_ids,
                mm_token_type_ids=inputs["mm_token_type_ids"],
                image_grid_thw=inputs.get("image_grid_thw"),
                attention_mask=inputs.get("attention_mask"),
            )
        record["position_ids"] = pos[:, 0, :].tolist()
        record["rope_delta"] = int(delta.reshape(-1)[0])
        model.model.rope_deltas = None

    # Prompt forward pass: last-position logits and the residual stream per layer.
    store, handles = capture_hidden_states(model, name)
    try:
        with torch.no_grad():
            out = model(**inputs, logits_to_keep=1, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    logits = out.logits[0, -1].to(torch.float32)
    assert logits.shape[0] == VOCAB_SIZE
    np.save(out_dir / f"{case_name}.logits.npy", logits.numpy())
    record["logits_file"] = f"{case_name}.logits.npy"
    hidden = torch.stack(store["layers"]).to(torch.float32)
    assert hidden.shape == (model.config.get_text_config().num_hidden_layers + 1, seq_len, 16), hidden.shape
    np.save(out_dir / f"{case_name}.hidden_states.npy", hidden.numpy())
    record["hidden_states_file"] = f"{case_name}.hidden_states.npy"
    if store["router_gaps"]:
        record["router_min_topk_gap"] = min(store["router_gaps"])

    # Greedy decoding with transformers' generate (KV cache), no logits processors.
    if is_vl:
        model.model.rope_deltas = None
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=GREEDY_STEPS, eos_token_id=list(EOS_IDS),
                               pad_token_id=BOS_ID)
    with torch.no_grad():
        gen = model.generate(**inputs, generation_config=gen_cfg, output_logits=True, return_dict_in_generate=True)
    tokens = gen.sequences[0, seq_len:].tolist()
    margins = []
    for step, step_logits in enumerate(gen.logits):
        lg = step_logits[0].to(torch.float32)
        top = lg.topk(2)
        assert int(top.indices[0]) == tokens[step], f"{case_name}: step {step} greedy token is not the argmax"
        margins.append(float(top.values[0] - top.values[1]))
    assert torch.allclose(gen.logits[0][0].to(torch.float32), logits, atol=1e-4, rtol=0), \
        f"{case_name}: generate's first-step logits differ from the forward pass"
    assert len(tokens) == GREEDY_STEPS, f"{case_name}: generation stopped after {len(tokens)} tokens"
    record["greedy_tokens"] = tokens
    record["greedy_margins"] = margins
    record["transformers_version"] = transformers.__version__
    record["torch_version"] = torch.__version__
    record["torchvision_version"] = torchvision.__version__
    record["attn_implementation"] = ATTN_IMPLEMENTATION
    record["experts_implementation"] = EXPERTS_IMPLEMENTATION
    record["compute_dtype"] = "float32"
    write_json(out_dir / f"{case_name}.json", record)
    return {"case": case_name, "prompt_tokens": seq_len, "min_margin": min(margins),
            "router_min_topk_gap": record.get("router_min_topk_gap")}


def load_official_weights(model_dir):
    """Reads every tensor of a fixture checkpoint (one file or an index + shards) as float64 numpy."""
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.exists():
        files = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        for k, t in safetensors.torch.load_file(str(model_dir / f)).items():
            w[k] = t.to(torch.float64).numpy()
    return w


def numpy_text_logits(name, w, cfg, ids, pos3, image_embeds=None, deepstack=None):
    """Independent float64 text-decoder forward from the official tensors; returns last-position logits.

    pos3 is [3, T] (t, h, w) positions; image_embeds replace the <|image_pad|> rows and deepstack[l]
    is added to those rows after layer l.
    """
    prefix = "model." if name in TEXT_MODELS else "model.language_model."
    n_heads, n_kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    section = (cfg.get("rope_scaling") or {}).get("mrope_section", [hd // 2, 0, 0])

    def rms(x, g):
        return g * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))

    # Interleaved M-RoPE: frequency j uses axis H if j % 3 == 1 and j < 3 * section[1], W likewise, else T.
    half = hd // 2
    axis = np.zeros(half, dtype=np.int64)
    for j in range(half):
        if j % 3 == 1 and j < 3 * section[1]:
            axis[j] = 1
        elif j % 3 == 2 and j < 3 * section[2]:
            axis[j] = 2
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.asarray(pos3, dtype=np.float64)[axis, :].T * inv[None, :]
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]

    def rope(x):
        return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin

    def silu(a):
        return a / (1 + np.exp(-a))

    t_len = len(ids)
    ids = np.asarray(ids)
    x = w[prefix + "embed_tokens.weight"][ids].copy()
    visual = ids == IMAGE_TOKEN_ID
    if image_embeds is not None:
        x[visual] = image_embeds
    causal = np.triu(np.full((t_len, t_len), -np.inf), 1)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"{prefix}layers.{layer}."
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
        if name in DENSE_MODELS:
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
                    if name == "qwen3_moe_tiny":  # per-expert nn.Linear [out, in]
                        e_p = f"{p}mlp.experts.{e}."
                        g = w[e_p + "gate_proj.weight"] @ h[tok]
                        u = w[e_p + "up_proj.weight"] @ h[tok]
                        y[tok] += we * (w[e_p + "down_proj.weight"] @ (silu(g) * u))
                    else:  # fused input-major [E, H, 2I] (gate = first I columns) and [E, I, H]
                        gu = h[tok] @ w[p + "mlp.experts.gate_up_proj"][e]
                        inter = gu.shape[0] // 2
                        y[tok] += we * ((silu(gu[:inter]) * gu[inter:]) @ w[p + "mlp.experts.down_proj"][e])
        x = x + y
        if deepstack is not None and layer < len(deepstack):
            x[visual] += deepstack[layer]
    x = rms(x, w[prefix + "norm.weight"])
    head_w = w.get("lm_head.weight", w[prefix + "embed_tokens.weight"])
    return x[-1] @ head_w.T


def check_text_independently(name, model_dir, ref_dir, case_names):
    """Checks each case's transformers logits against the float64 numpy text forward; returns max |diff|.

    For VL cases the vision outputs recorded from transformers are the inputs; the check covers the
    official tensor layouts, M-RoPE positions, DeepStack injection and tied embeddings.
    """
    w = load_official_weights(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    worst = 0.0
    for case_name in case_names:
        rec = json.loads((ref_dir / f"{case_name}.json").read_text())
        ids = rec["prompt_ids"]
        pos3 = rec.get("position_ids", [list(range(len(ids)))] * 3)
        embeds = ds = None
        if "vision_embeds_file" in rec:
            embeds = np.load(ref_dir / rec["vision_embeds_file"]).astype(np.float64)
            ds = np.load(ref_dir / rec["deepstack_file"]).astype(np.float64)
        want = np.load(ref_dir / rec["logits_file"]).astype(np.float64)
        got = numpy_text_logits(name, w, cfg, ids, pos3, embeds, ds)
        diff = float(np.abs(got - want).max())
        assert diff < 1e-3, f"{name}/{case_name}: numpy forward differs from transformers by {diff}"
        worst = max(worst, diff)
    return worst


def numpy_patchify(img_u8):
    """Resized uint8 image [H, W, 3] -> pixel_values rows [H/16 * W/16, 1536] in the 2x2-block order."""
    u = img_u8.astype(np.float64)
    x = (u - 127.5) / 127.5
    gh, gw = x.shape[0] // 16, x.shape[1] // 16
    x = x.reshape(gh // 2, 2, 16, gw // 2, 2, 16, 3)  # br, ir, py, bc, ic, px, ch
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # br, bc, ir, ic, ch, py, px
    x = np.repeat(x[:, :, :, :, :, None], 2, axis=5)  # temporal pair: ch, tt, py, px
    return x.reshape(gh * gw, 1536)


def numpy_vision(w, vcfg, rows, grids):
    """Independent float64 vision tower; returns (merged embeds [N/4, D], deepstack [n, N/4, D])."""
    p = "model.visual."
    dim, n_heads = vcfg["hidden_size"], vcfg["num_heads"]
    hd = dim // n_heads
    side = int(round(math.sqrt(vcfg["num_position_embeddings"])))

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-6) * g + b

    def gelu_tanh(a):
        return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))

    def gelu_erf(a):
        return 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))

    def merger(x, name, post_shuffle):
        if post_shuffle:
            x = x.reshape(-1, 4 * dim)
            x = ln(x, w[name + "norm.weight"], w[name + "norm.bias"])
        else:
            x = ln(x, w[name + "norm.weight"], w[name + "norm.bias"]).reshape(-1, 4 * dim)
        x = gelu_erf(x @ w[name + "linear_fc1.weight"].T + w[name + "linear_fc1.bias"])
        return x @ w[name + "linear_fc2.weight"].T + w[name + "linear_fc2.bias"]

    pe_w = w[p + "patch_embed.proj.weight"].reshape(dim, -1)
    x = rows @ pe_w.T + w[p + "patch_embed.proj.bias"]
    table = w[p + "pos_embed.weight"]
    pos_rows, coords, segments = [], [], []
    start = 0
    for t, gh, gw in grids:
        def taps(n):
            s = np.linspace(0, side - 1, n, dtype=np.float64)
            i0 = np.floor(s).astype(np.int64)
            return i0, np.minimum(i0 + 1, side - 1), s - i0

        r0, r1, fr = taps(gh)
        c0, c1, fc = taps(gw)
        grid_pos = np.zeros((gh, gw, dim))
        for r in range(gh):
            for c in range(gw):
                grid_pos[r, c] = ((1 - fr[r]) * (1 - fc[c]) * table[side * r0[r] + c0[c]]
                                  + (1 - fr[r]) * fc[c] * table[side * r0[r] + c1[c]]
                                  + fr[r] * (1 - fc[c]) * table[side * r1[r] + c0[c]]
                                  + fr[r] * fc[c] * table[side * r1[r] + c1[c]])
        for _ in range(t):
            for br in range(gh // 2):
                for bc in range(gw // 2):
                    for ir in range(2):
                        for ic in range(2):
                            r, c = 2 * br + ir, 2 * bc + ic
                            pos_rows.append(grid_pos[r, c])
                            coords.append((r, c))
            segments.append((start, start + gh * gw))
            start += gh * gw
    x = x + np.stack(pos_rows)
    coords = np.asarray(coords, dtype=np.float64)
    inv = 10000.0 ** (-np.arange(0, hd // 2, 2, dtype=np.float64) / (hd // 2))
    ang = np.concatenate([coords[:, :1] * inv, coords[:, 1:] * inv], -1)
    cos = np.cos(np.concatenate([ang, ang], -1))[:, None, :]
    sin = np.sin(np.concatenate([ang, ang], -1))[:, None, :]

    def rope(a):
        return a * cos + np.concatenate([-a[..., hd // 2:], a[..., :hd // 2]], -1) * sin

    deepstack = []
    n = x.shape[0]
    for b in range(vcfg["depth"]):
        bp = f"{p}blocks.{b}."
        h = ln(x, w[bp + "norm1.weight"], w[bp + "norm1.bias"])
        qkv = (h @ w[bp + "attn.qkv.weight"].T + w[bp + "attn.qkv.bias"]).reshape(n, 3, n_heads, hd)
        q, k, v = rope(qkv[:, 0]), rope(qkv[:, 1]), qkv[:, 2]
        o = np.zeros((n, n_heads, hd))
        for s0, s1 in segments:
            for head in range(n_heads):
                s = q[s0:s1, head] @ k[s0:s1, head].T / math.sqrt(hd)
                s = np.exp(s - s.max(-1, keepdims=True))
                o[s0:s1, head] = (s / s.sum(-1, keepdims=True)) @ v[s0:s1, head]
        x = x + o.reshape(n, dim) @ w[bp + "attn.proj.weight"].T + w[bp + "attn.proj.bias"]
        h = ln(x, w[bp + "norm2.weight"], w[bp + "norm2.bias"])
        h = gelu_tanh(h @ w[bp + "mlp.linear_fc1.weight"].T + w[bp + "mlp.linear_fc1.bias"])
        x = x + h @ w[bp + "mlp.linear_fc2.weight"].T + w[bp + "mlp.linear_fc2.bias"]
        if b in vcfg["deepstack_visual_indexes"]:
            j = vcfg["deepstack_visual_indexes"].index(b)
            deepstack.append(merger(x, f"{p}deepstack_merger_list.{j}.", True))
    return merger(x, p + "merger.", False), np.stack(deepstack)


def check_vision_independently(model_dir, ref_dir, case_names):
    """Rebuilds pixel_values from the resized images and re-runs the vision tower in numpy float64.

    Returns (max |pixel diff| over the recorded head, max |embed diff|, max |deepstack diff|).
    """
    w = load_official_weights(model_dir)
    vcfg = json.loads((model_dir / "config.json").read_text())["vision_config"]
    worst = [0.0, 0.0, 0.0]
    for case_name in case_names:
        rec = json.loads((ref_dir / f"{case_name}.json").read_text())
        if "resized_images" not in rec:
            continue
        rows = np.concatenate([numpy_patchify(np.load(ref_dir / f)) for f in rec["resized_images"]])
        assert rows.shape == (rec["pixel_values_rows"], rec["pixel_values_cols"])
        pix = float(np.abs(rows[:4] - np.asarray(rec["pixel_values_head"])).max())
        assert pix < 1e-6, f"{case_name}: patchified resized images differ from pixel_values_head by {pix}"
        for blk in rec["pixel_values_blocks"]:
            got = rows[blk["row_begin"]:blk["row_end"]]
            # The processor's values are float32 (u - 127.5) / 127.5: allow 1e-7 relative per element.
            tol = 1e-7 * blk["abs_sum"] + 1e-6
            assert abs(got.sum() - blk["sum"]) < tol and abs(np.abs(got).sum() - blk["abs_sum"]) < tol, \
                (case_name, got.sum() - blk["sum"], np.abs(got).sum() - blk["abs_sum"])
        embeds, ds = numpy_vision(w, vcfg, rows, rec["image_grid_thw"])
        e_diff = float(np.abs(embeds - np.load(ref_dir / rec["vision_embeds_file"])).max())
        d_diff = float(np.abs(ds - np.load(ref_dir / rec["deepstack_file"])).max())
        assert e_diff < 1e-3 and d_diff < 1e-3, f"{case_name}: numpy vision differs ({e_diff}, {d_diff})"
        worst = [max(worst[0], pix), max(worst[1], e_diff), max(worst[2], d_diff)]
    return worst


def cases_for(name):
    """Returns (case name, request) pairs of one model."""
    if name in TEXT_MODELS:
        return [(c, make_request(name, m, None)) for c, m in TEXT_CASES]
    return [(c, make_request(name, m, k)) for c, m, k in VL_CASES]


# ----------------------------------------------------------------------------------------------
# README
# ----------------------------------------------------------------------------------------------


def dir_bytes(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def write_readme(out, model_summaries, case_summaries):
    """Writes tests/fixtures/README.md with the regeneration command, inventory and layout notes."""
    lines = []
    lines.append("# zest test fixtures (generated)")
    lines.append("")
    lines.append("Everything under `models/` and `ref/` is written by `tools/make_fixtures.py`; do not edit by hand.")
    lines.append("Regenerate from the repository root with")
    lines.append("")
    lines.append("    /opt/refenv/bin/python tools/make_fixtures.py --out tests/fixtures")
    lines.append("")
    lines.append(f"Made with transformers {transformers.__version__}, torch {torch.__version__}, "
                 f"torchvision {torchvision.__version__}, safetensors {safetensors.__version__}, "
                 f"numpy {np.__version__}, Python {platform.python_version()}, "
                 f"torch threads 1. The script is seeded; a rerun gives the same bytes.")
    lines.append("")
    lines.append("## Models (`models/<name>/`)")
    lines.append("")
    lines.append("Random weights, every tensor stored as BF16. Norm weights are 1 + 0.1*N(0,1), biases 0.1*N(0,1),")
    lines.append("linear weights N(0,1)/sqrt(fan_in), the MoE router 3*N(0,1)/sqrt(hidden), lm_head 2*N(0,1)/sqrt(hidden),")
    lines.append("embeddings N(0,1), the vision pos_embed 0.5*N(0,1). Real Qwen vocabulary (151936 rows).")
    lines.append("")
    lines.append("| model | class | text | vision | tensors | parameters | weight bytes | dir bytes |")
    lines.append("|---|---|---|---|---|---|---|---|")
    desc = {
        "qwen3_moe_tiny": ("Qwen3MoeForCausalLM", "hidden 16, 3 layers, 4/2 heads, head_dim 16, 16 experts top-4, "
                           "moe_intermediate 24, norm_topk_prob, rope_theta 1e6, untied", "-"),
        "qwen3_vl_moe_tiny": ("Qwen3VLMoeForConditionalGeneration", "as qwen3_moe_tiny, rope_theta 5e6, "
                              "mrope_section [4,2,2] interleaved, untied", "depth 3, hidden 32, 2 heads, "
                              "intermediate 48, 8x8 pos table, out 16, deepstack [0,1]"),
        "qwen3_vl_tiny": ("Qwen3VLForConditionalGeneration", "hidden 16, 3 layers, dense SwiGLU intermediate 40, "
                          "mrope as above, tie_word_embeddings (no lm_head.weight stored)", "as qwen3_vl_moe_tiny"),
        "qwen3_tiny": ("Qwen3ForCausalLM", "hidden 16, 3 layers, 4/2 heads, head_dim 16, dense SwiGLU intermediate 40, "
                       "rope_theta 1e6, tie_word_embeddings (no lm_head.weight stored)", "-"),
    }
    for name, s in model_summaries.items():
        cls, text, vision = desc[name]
        lines.append(f"| {name} | {cls} | {text} | {vision} | {s['tensors']} | {s['parameters']} | "
                     f"{s['bytes']} | {dir_bytes(out / 'models' / name)} |")
    lines.append("")
    lines.append("Each directory holds `config.json`, `generation_config.json` (eos [151645, 151643], Qwen's")
    lines.append("temperature/top_p/top_k), the weights, `tokenizer.json` (a relative symlink to")
    lines.append("`assets/tokenizer/tokenizer.json`), a small `tokenizer_config.json` (Qwen3's, without the")
    lines.append("added-token table and template), `chat_template.jinja` (Qwen3 hybrid-thinking template for the text")
    lines.append("model, Qwen3-VL Instruct template for the VL models) and, for the VL models,")
    lines.append("`preprocessor_config.json` (Qwen3-VL values: patch 16, temporal 2, merge 2, mean/std 0.5,")
    lines.append("size {shortest_edge 65536, longest_edge 16777216}).")
    lines.append("")
    lines.append("### Layout notes")
    lines.append("")
    lines.append("- `qwen3_moe_tiny`: two shards `model-0000{1,2}-of-00002.safetensors` + `model.safetensors.index.json`")
    lines.append("  (`weight_map`, `metadata.total_size` = sum of tensor bytes). Keys `model.*` and `lm_head.weight`;")
    lines.append("  experts one tensor each: `model.layers.L.mlp.experts.E.{gate,up}_proj.weight` [24, 16] and")
    lines.append("  `...down_proj.weight` [16, 24] (nn.Linear [out, in], y = x W^T). Router `mlp.gate.weight` [16, 16].")
    lines.append("- `qwen3_vl_moe_tiny`: one `model.safetensors`; keys `model.language_model.*`, `model.visual.*`,")
    lines.append("  `lm_head.weight`. Experts fused and input-major, no `.weight` suffix:")
    lines.append("  `mlp.experts.gate_up_proj` [16, 16, 48] = [E, H, 2I], gate = columns 0..23, up = columns 24..47;")
    lines.append("  `mlp.experts.down_proj` [16, 24, 16] = [E, I, H]; y = x @ W.")
    lines.append("- `qwen3_vl_tiny`: as above with dense `mlp.{gate,up}_proj.weight` [40, 16], `down_proj.weight` [16, 40];")
    lines.append("  no `lm_head.weight` (tied to `model.language_model.embed_tokens.weight`).")
    lines.append("- `qwen3_tiny`: one `model.safetensors`; keys `model.*`, dense MLPs as `qwen3_vl_tiny`, no `lm_head.weight`")
    lines.append("  (tied to `model.embed_tokens.weight`).")
    lines.append("- transformers 5.x keeps experts in memory as `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I];")
    lines.append("  the script converts to the official layouts above, loads each directory back with")
    lines.append("  `from_pretrained` (no missing/unexpected/mismatched keys) and checks every parameter is bit-equal.")
    lines.append("  Since H != 2I and H != I, a swapped gate/up half or a missing transpose would fail that check.")
    lines.append("- `config.json` is what transformers writes (`rope_parameters`, `num_local_experts`, `dtype`) plus the")
    lines.append("  keys real Qwen checkpoints carry, added only where missing and checked to load back to the same")
    lines.append("  config: " + "; ".join(f"{n}: {', '.join(s['added_config_keys'])}"
                                            for n, s in model_summaries.items()) + ".")
    lines.append("")
    lines.append("### Independent checks (run by the script every time)")
    lines.append("")
    lines.append("A plain float64 numpy forward that reads only the official files (no transformers code) reproduces")
    lines.append("the recorded outputs: the text decoders from `prompt_ids`, `position_ids` and the recorded vision")
    lines.append("outputs (per-expert / fused input-major / dense MLPs, interleaved M-RoPE, DeepStack, tied head),")
    lines.append("and the vision tower from the resized images (patchify order, bilinear pos-embed resampling,")
    lines.append("2-D RoPE, per-image attention segments, mergers). Largest absolute differences:")
    lines.append("")
    for name, s in model_summaries.items():
        text = f"- {name}: last-position logits {s['numpy_max_abs_logit_diff']:.2g}"
        if "numpy_vision_max_abs_diff" in s:
            pix, emb, ds = s["numpy_vision_max_abs_diff"]
            text += f"; pixel_values head {pix:.2g}, vision embeds {emb:.2g}, deepstack {ds:.2g}"
        lines.append(text)
    lines.append("")
    lines.append("## Reference cases (`ref/<model>/<case>.json`)")
    lines.append("")
    lines.append("Each case is an OpenAI chat-completions body run through transformers in float32 (bf16 weights")
    lines.append(f"upcast), attention `{ATTN_IMPLEMENTATION}`, experts `{EXPERTS_IMPLEMENTATION}`. The prompt is rendered")
    lines.append("with the model directory's chat template (`apply_chat_template`, add_generation_prompt, default")
    lines.append("enable_thinking); images are loaded the way transformers loads a path (torchvision decode, RGB) and")
    lines.append("processed by the torchvision (\"Fast\") Qwen2VL image processor with the case's")
    lines.append("`mm_processor_kwargs` (min_pixels / max_pixels). Image URLs `file://assets/images/<name>` are relative")
    lines.append("to the repository root.")
    lines.append("")
    lines.append("| model | case | prompt tokens | min greedy margin | min router top-k gap |")
    lines.append("|---|---|---|---|---|")
    for name, rows in case_summaries.items():
        for r in rows:
            gap = "-" if r["router_min_topk_gap"] is None else f"{r['router_min_topk_gap']:.4f}"
            lines.append(f"| {name} | {r['case']} | {r['prompt_tokens']} | {r['min_margin']:.4f} | {gap} |")
    lines.append("")
    lines.append("File paths inside a case JSON are relative to that JSON's directory. Fields:")
    lines.append("")
    for field, meaning in SCHEMA:
        lines.append(f"- `{field}`: {meaning}")
    lines.append("")
    lines.append(f"Total size of models/ + ref/: {dir_bytes(out / 'models') + dir_bytes(out / 'ref')} bytes "
                 "(the six 151936x16 bf16 vocabulary matrices alone are 29,171,712 bytes).")
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


SCHEMA = [
    ("request", "the OpenAI chat-completions body (`model`, `messages`, `max_tokens` 16, `temperature` 0, and for "
                "VL cases with images `mm_processor_kwargs` {`min_pixels`, `max_pixels`})"),
    ("prompt_text", "the rendered chat template (one `<|image_pad|>` per image, before expansion)"),
    ("prompt_ids", "token ids fed to the model, after image-token expansion"),
    ("logits_file", "`<case>.logits.npy`, float32 [151936]: logits of the last prompt position"),
    ("hidden_states_file", "`<case>.hidden_states.npy`, float32 [num_layers + 1, T, 16]: row l = residual stream "
                           "entering decoder layer l (row 0 = embeddings with image rows replaced; DeepStack "
                           "additions show up in the rows after layers 0 and 1), last row = input of the final norm"),
    ("greedy_tokens", "16 tokens from `generate(do_sample=False)` (KV cache, no logits processors)"),
    ("greedy_margins", "top-1 minus top-2 logit at each of the 16 steps"),
    ("router_min_topk_gap", "MoE models: smallest (k-th minus (k+1)-th) router logit over all prompt tokens and "
                            "layers (how decisive routing is)"),
    ("transformers_version, torch_version, torchvision_version", "the reference's versions"),
    ("attn_implementation, experts_implementation, compute_dtype", "how transformers ran"),
    ("image_processor", "VL: {`class`, `backend`, `image_loader`, `resize`}"),
    ("image_grid_thw", "VL with images: [[t, h, w], ...] per image (patch grid)"),
    ("pixel_values_rows, pixel_values_cols", "shape of `pixel_values` ([sum t*h*w, 1536])"),
    ("pixel_values_head", "the first 4 rows of `pixel_values` (float32)"),
    ("pixel_values_sum, pixel_values_abs_sum", "checksums over all of `pixel_values` (float64 sums)"),
    ("pixel_values_blocks", "per image: {`image`, `row_begin`, `row_end`, `sum`, `abs_sum`}"),
    ("images", "per image: {`path`, `decoded_height`, `decoded_width`, `decoded_u8_sum` (sum of all decoded RGB "
               "bytes), `resized_height`, `resized_width`, `llm_tokens`}"),
    ("resized_images", "per image: `../preprocess/<case>.image<k>.u8.npy`, uint8 [H, W, 3], the resized image "
                       "before normalisation (pixel_values = (u - 127.5) / 127.5, shared by both VL models)"),
    ("vision_embeds_rows, vision_embeds_head", "number of merged image embeddings fed to the LLM, and the first 4 "
                                               "rows (float32 [4, 16])"),
    ("vision_embeds_sums", "per image: {`rows`, `sum`, `abs_sum`}"),
    ("vision_embeds_file", "`<case>.vision_embeds.npy`, float32 [N, 16], all merged image embeddings"),
    ("deepstack_head", "first 2 rows of each DeepStack feature ([2][2][16])"),
    ("deepstack_sums", "per DeepStack feature: {`sum`, `abs_sum`}"),
    ("deepstack_file", "`<case>.deepstack.npy`, float32 [2, N, 16]"),
    ("position_ids", "VL: the 3 x T M-RoPE ids (t, h, w rows) from `get_rope_index`"),
    ("rope_delta", "VL: max position + 1 - T; the i-th generated token (0-based), when fed back, sits at "
                   "position T + i + rope_delta on all three axes"),
]


# ----------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures", help="fixture root (default tests/fixtures)")
    parser.add_argument("--models", nargs="*", default=list(MODEL_CLASSES), help="subset of models to build")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    out = Path(args.out).resolve()
    os.chdir(REPO)
    preprocess_dir = out / "ref" / "preprocess"
    if preprocess_dir.exists() and set(args.models) == set(MODEL_CLASSES):
        shutil.rmtree(preprocess_dir)
    preprocess_dir.mkdir(parents=True, exist_ok=True)
    model_summaries, case_summaries = {}, {}
    for name in args.models:
        model_dir = out / "models" / name
        model, summary = build_model_dir(name, model_dir)
        model_summaries[name] = summary
        if name in VL_MODELS:
            proc = AutoProcessor.from_pretrained(str(model_dir))
            assert proc.image_processor.backend == "torchvision", proc.image_processor.backend
        else:
            proc = AutoTokenizer.from_pretrained(str(model_dir))
        ref_dir = out / "ref" / name
        if ref_dir.exists():
            shutil.rmtree(ref_dir)
        ref_dir.mkdir(parents=True)
        rows = []
        for case_name, request in cases_for(name):
            rows.append(run_case(model, name, proc, case_name, request, ref_dir, preprocess_dir))
            print(f"{name}/{case_name}: {rows[-1]}", flush=True)
        case_summaries[name] = rows
        diff = check_text_independently(name, model_dir, ref_dir, [c for c, _ in cases_for(name)])
        model_summaries[name]["numpy_max_abs_logit_diff"] = diff
        print(f"{name}: float64 numpy text forward matches transformers, max |logit diff| {diff:.3g}", flush=True)
        if name in VL_MODELS:
            vdiff = check_vision_independently(model_dir, ref_dir, [c for c, _ in cases_for(name)])
            model_summaries[name]["numpy_vision_max_abs_diff"] = vdiff
            print(f"{name}: float64 numpy vision matches transformers, max |diff| pixels {vdiff[0]:.3g}, "
                  f"embeds {vdiff[1]:.3g}, deepstack {vdiff[2]:.3g}", flush=True)
    if set(args.models) == set(MODEL_CLASSES):
        write_readme(out, model_summaries, case_summaries)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
