"""Builds the reference fixtures of tests/io from transformers 5.17, safetensors, torch and numpy.

Run with the reference venv from the repository root:
    /opt/refenv/bin/python tests/io/data/make_io_fixtures.py

Writes into tests/io/data/:
  hf517_*.config.json       configs serialized by transformers (rope_parameters, num_local_experts, ...)
  expected_configs.json     per config file: the values transformers holds after loading it, or the
                            field that makes the config invalid
  st_all_dtypes.safetensors tensors of every supported dtype written by safetensors.torch
  st_all_dtypes.json        their dtypes, shapes and values as torch reads them
  npy_*.npy, npy_expected.json  arrays written by numpy and their values
"""
import json
import os
import shutil
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (GenerationConfig, Qwen2VLImageProcessor, Qwen3Config, Qwen3MoeConfig, Qwen3MoeForCausalLM,
                          Qwen3VLConfig, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

HERE = os.path.dirname(os.path.abspath(__file__))
CLASSES = {"qwen3_moe": Qwen3MoeConfig, "qwen3_vl_moe": Qwen3VLMoeConfig, "qwen3_vl": Qwen3VLConfig, "qwen3": Qwen3Config}
TEXT_ONLY = ("qwen3_moe", "qwen3")
DENSE = ("qwen3_vl", "qwen3")


def moe_layers_by_rule(tc):
    # The decoder-layer condition of modeling_qwen3_moe.py / modeling_qwen3_vl_moe.py.
    return [l for l in range(tc.num_hidden_layers)
            if l not in tc.mlp_only_layers and tc.num_experts > 0 and (l + 1) % tc.decoder_sparse_step == 0]


def expected(cfg, moe_layers=None):
    arch = cfg.model_type
    tc = cfg if arch in TEXT_ONLY else cfg.text_config
    rp = tc.rope_parameters
    text = {
        "vocab_size": tc.vocab_size,
        "hidden_size": tc.hidden_size,
        "num_layers": tc.num_hidden_layers,
        "num_heads": tc.num_attention_heads,
        "num_kv_heads": tc.num_key_value_heads,
        "head_dim": getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": float(rp["rope_theta"]),
        "max_position_embeddings": tc.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    }
    if arch in DENSE:
        text["intermediate_size"] = tc.intermediate_size
        text["num_experts"] = 0
        text["moe_layers"] = []
    else:
        text["intermediate_size"] = tc.intermediate_size
        text["moe_intermediate_size"] = tc.moe_intermediate_size
        text["num_experts"] = tc.num_experts
        text["num_experts_per_tok"] = tc.num_experts_per_tok
        # Qwen3-VL-MoE's router always renormalises (modeling: router_top_value /= sum).
        text["norm_topk_prob"] = tc.norm_topk_prob if arch == "qwen3_moe" else True
        text["moe_layers"] = moe_layers if moe_layers is not None else moe_layers_by_rule(tc)
    out = {"arch": arch, "text": text}
    if arch not in TEXT_ONLY:
        # Qwen3-VL's rotary embedding reads mrope_section with this default and always interleaves.
        text["mrope_section"] = list(rp.get("mrope_section", [24, 20, 20]))
        vc = cfg.vision_config
        out["vision"] = {
            "depth": vc.depth, "hidden_size": vc.hidden_size, "num_heads": vc.num_heads,
            "intermediate_size": vc.intermediate_size, "patch_size": vc.patch_size,
            "temporal_patch_size": vc.temporal_patch_size, "spatial_merge_size": vc.spatial_merge_size,
            "in_channels": vc.in_channels, "out_hidden_size": vc.out_hidden_size,
            "num_position_embeddings": vc.num_position_embeddings, "hidden_act": vc.hidden_act,
            "deepstack_visual_indexes": list(vc.deepstack_visual_indexes),
        }
        out["image_token_id"] = cfg.image_token_id
        out["video_token_id"] = cfg.video_token_id
        out["vision_start_token_id"] = cfg.vision_start_token_id
        out["vision_end_token_id"] = cfg.vision_end_token_id
    return out


def instantiated_moe_layers(cfg):
    # Builds the (tiny) model and reads which decoder layers got a sparse MoE block.
    if cfg.model_type == "qwen3_moe":
        layers = Qwen3MoeForCausalLM(cfg).model.layers
        block = Qwen3MoeSparseMoeBlock
    else:
        layers = Qwen3VLMoeForConditionalGeneration(cfg).model.language_model.layers
        block = Qwen3VLMoeTextSparseMoeBlock
    return [i for i, layer in enumerate(layers) if isinstance(layer.mlp, block)]


def write_config(name, cfg):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(cfg.to_json_string())


def make_configs():
    exp = {}
    for name in ["qwen3_30b_a3b", "qwen3_vl_30b_a3b_instruct", "qwen3_vl_8b_instruct", "qwen3_8b"]:
        src = f"{name}.config.json"
        with open(os.path.join(HERE, src)) as f:
            arch = json.load(f)["model_type"]
        cfg = CLASSES[arch].from_json_file(os.path.join(HERE, src))
        exp[src] = expected(cfg)
        write_config(f"hf517_{src}", cfg)
        exp[f"hf517_{src}"] = expected(cfg)

    # Configs holding only the fields zest requires: every other value is a transformers default.
    required_text = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"]
    required_moe = ["moe_intermediate_size", "num_experts", "num_experts_per_tok"]
    required_vision = ["depth", "hidden_size", "num_heads", "intermediate_size", "out_hidden_size"]
    for name, arch in [("qwen3_30b_a3b", "qwen3_moe"), ("qwen3_vl_30b_a3b_instruct", "qwen3_vl_moe"),
                       ("qwen3_vl_8b_instruct", "qwen3_vl"), ("qwen3_8b", "qwen3")]:
        with open(os.path.join(HERE, f"{name}.config.json")) as f:
            full = json.load(f)
        keep = required_text + (["intermediate_size"] if arch in DENSE else required_moe)
        if arch in TEXT_ONLY:
            minimal = {"model_type": arch, **{k: full[k] for k in keep}}
        else:
            minimal = {"model_type": arch, "text_config": {k: full["text_config"][k] for k in keep},
                       "vision_config": {k: full["vision_config"][k] for k in required_vision}}
        src = f"minimal_{arch}.config.json"
        with open(os.path.join(HERE, src), "w") as f:
            json.dump(minimal, f, indent=2)
        exp[src] = expected(CLASSES[arch].from_json_file(os.path.join(HERE, src)))
        if arch not in DENSE:
            # Unused when every layer is MoE; zest leaves it 0 rather than guess the class default.
            del exp[src]["text"]["intermediate_size"]

    # Tiny minimal configs whose hidden / heads differs from 128: the head_dim defaults differ per class.
    tiny_minimal = {
        "minimal_tiny_qwen3_moe.config.json": {
            "model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 8, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
        "minimal_tiny_qwen3_vl_moe.config.json": {
            "model_type": "qwen3_vl_moe",
            "text_config": {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 16,
                            "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
            "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48,
                              "out_hidden_size": 64, "deepstack_visual_indexes": [1]}},
        "minimal_tiny_qwen3_vl.config.json": {
            "model_type": "qwen3_vl",
            "text_config": {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 32,
                            "intermediate_size": 96},
            "vision_config": {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48,
                              "out_hidden_size": 64, "deepstack_visual_indexes": [0]}},
    }
    for src, cfg in tiny_minimal.items():
        with open(os.path.join(HERE, src), "w") as f:
            json.dump(cfg, f, indent=2)
        exp[src] = expected(CLASSES[cfg["model_type"]].from_json_file(os.path.join(HERE, src)))
        if cfg["model_type"] != "qwen3_vl":
            del exp[src]["text"]["intermediate_size"]

    tiny_text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=48, num_experts=8,
                     num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3])
    tiny = Qwen3MoeConfig(**tiny_text)
    write_config("hf517_tiny_sparse_qwen3_moe.config.json", tiny)
    exp["hf517_tiny_sparse_qwen3_moe.config.json"] = expected(tiny, instantiated_moe_layers(tiny))

    tiny_vl = Qwen3VLMoeConfig(
        text_config=dict(tiny_text, head_dim=16, decoder_sparse_step=1, mlp_only_layers=[1, 4],
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=40, out_hidden_size=64,
                           num_position_embeddings=64, deepstack_visual_indexes=[0, 2]))
    write_config("hf517_tiny_qwen3_vl_moe.config.json", tiny_vl)
    exp["hf517_tiny_qwen3_vl_moe.config.json"] = expected(tiny_vl, instantiated_moe_layers(tiny_vl))

    moe_default = Qwen3MoeConfig()
    write_config("hf517_default_qwen3_moe.config.json", moe_default)
    exp["hf517_default_qwen3_moe.config.json"] = expected(moe_default)
    dense_default = Qwen3Config()
    write_config("hf517_default_qwen3.config.json", dense_default)
    exp["hf517_default_qwen3.config.json"] = expected(dense_default)

    # The class defaults pair a 3584-wide vision output with a 2048/4096-wide decoder: invalid as a model.
    for name, cls in [("qwen3_vl_moe", Qwen3VLMoeConfig), ("qwen3_vl", Qwen3VLConfig)]:
        cfg = cls()
        assert cfg.vision_config.out_hidden_size != cfg.text_config.hidden_size
        write_config(f"hf517_default_{name}.config.json", cfg)
        exp[f"hf517_default_{name}.config.json"] = {"error": "out_hidden_size"}
        fixed = cls(vision_config={"out_hidden_size": cfg.text_config.hidden_size})
        write_config(f"hf517_default_{name}_matched.config.json", fixed)
        exp[f"hf517_default_{name}_matched.config.json"] = expected(fixed)

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(HERE, "qwen3_vl.generation_config.json"), os.path.join(d, "generation_config.json"))
        g = GenerationConfig.from_pretrained(d)
        exp["qwen3_vl.generation_config.json"] = {
            "temperature": g.temperature, "top_p": g.top_p, "top_k": g.top_k,
            "eos_token_ids": g.eos_token_id if isinstance(g.eos_token_id, list) else [g.eos_token_id]}
    for name in ["qwen3_vl.preprocessor_config.json", "qwen2_vl_style.preprocessor_config.json"]:
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(os.path.join(HERE, name), os.path.join(d, "preprocessor_config.json"))
            p = Qwen2VLImageProcessor.from_pretrained(d)
            exp[name] = {"patch_size": p.patch_size, "temporal_patch_size": p.temporal_patch_size,
                         "merge_size": p.merge_size, "min_pixels": p.size["shortest_edge"],
                         "max_pixels": p.size["longest_edge"], "image_mean": list(p.image_mean),
                         "image_std": list(p.image_std)}
    with open(os.path.join(HERE, "expected_configs.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)


def make_safetensors():
    g = torch.Generator().manual_seed(1234)
    tensors = {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "f16": (torch.randn(2, 7, generator=g) * 300).to(torch.float16),
        "i32": torch.randint(-2**31, 2**31 - 1, (5,), generator=g, dtype=torch.int32),
        "i64": torch.randint(-2**62, 2**62, (2, 3), generator=g, dtype=torch.int64),
        "u8": torch.randint(0, 256, (6,), generator=g, dtype=torch.uint8),
        "scalar": torch.randn((), generator=g),
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    save_file(tensors, os.path.join(HERE, "st_all_dtypes.safetensors"), metadata={"format": "pt", "source": "torch"})
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32",
             torch.int64: "I64", torch.uint8: "U8"}
    exp = {}
    for k, t in tensors.items():
        floating = t.is_floating_point()
        exp[k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                  "values": (t.float() if floating else t).flatten().tolist()}
    with open(os.path.join(HERE, "st_all_dtypes.json"), "w") as f:
        json.dump({"tensors": exp, "metadata": {"format": "pt", "source": "torch"}}, f, indent=1, sort_keys=True)


def make_npy():
    rng = np.random.default_rng(99)
    arrays = {
        "npy_f4.npy": (rng.standard_normal((3, 4)).astype("<f4"), (1, 0)),
        "npy_f2.npy": ((rng.standard_normal(5) * 100).astype("<f2"), (1, 0)),
        "npy_i4.npy": (rng.integers(-2**31, 2**31 - 1, (2, 2, 2)).astype("<i4"), (1, 0)),
        "npy_i8.npy": (rng.integers(-2**62, 2**62, 3).astype("<i8"), (1, 0)),
        "npy_f4_v2.npy": (rng.standard_normal((2, 3)).astype("<f4"), (2, 0)),
        "npy_scalar_f4.npy": (np.array(rng.standard_normal(), dtype="<f4"), (1, 0)),
        "npy_empty_f4.npy": (np.zeros((0, 3), dtype="<f4"), (1, 0)),
    }
    exp = {}
    for name, (a, version) in arrays.items():
        with open(os.path.join(HERE, name), "wb") as f:
            np.lib.format.write_array(f, a, version=version)
        floating = a.dtype.kind == "f"
        exp[name] = {"descr": a.dtype.str, "shape": list(a.shape),
                     "values": (a.astype(np.float32).astype(np.float64) if floating else a).reshape(-1).tolist()}
    with open(os.path.join(HERE, "npy_expected.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    make_configs()
    make_safetensors()
    make_npy()
