"""Trains the demo Qwen3-VL-MoE from scratch on the procedural tasks, in resumable chunks.

    python3 tools/demo_model/train.py --work DIR [--minutes 8.5]

DIR holds the tokenizer (made on first use), `ckpt.pt` (fp32 weights, optimizer, step) and
`train_log.jsonl`. Each call trains until --minutes have passed or --steps are done, then saves;
the next call resumes. The data stream is a function of (seed, step), so a resumed run sees exactly
the batches an uninterrupted one would. Weights are fp32 masters under bf16 autocast (a bf16-only
prototype diverged at lr 1e-3).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data  # noqa: E402
import make_tokenizer  # noqa: E402
import tasks  # noqa: E402

TRAIN_SEED = 1
PROBE_SEED = 99  # a held-out stream for the progress probe (the shipped eval split uses another)


def model_config(special: dict):
    from transformers import Qwen3VLMoeConfig

    vocab = (special["vocab_size"] + 63) // 64 * 64
    # About 4.3M parameters (8.5 MB in bf16): the repository travels to GPU machines whole, so the
    # default model has to stay small; the tasks need far less than a real model's width.
    text = dict(
        vocab_size=vocab, hidden_size=192, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1,
        head_dim=64, hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False, max_position_embeddings=4096,
        intermediate_size=384, moe_intermediate_size=48, num_experts=16, num_experts_per_tok=4,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, router_aux_loss_coef=0.001,
        tie_word_embeddings=False, bos_token_id=special["<|endoftext|>"], eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "mrope_section": [12, 10, 10],
                         "mrope_interleaved": True},
    )
    vision = dict(
        depth=4, hidden_size=128, num_heads=2, intermediate_size=384, hidden_act="gelu_pytorch_tanh",
        in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=576,
        out_hidden_size=192, deepstack_visual_indexes=[1],
    )
    cfg = Qwen3VLMoeConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=False,
        image_token_id=special["<|image_pad|>"], video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"], vision_end_token_id=special["<|vision_end|>"],
    )
    cfg.architectures = ["Qwen3VLMoeForConditionalGeneration"]
    return cfg


def build_model(cfg, experts: str):
    from transformers import Qwen3VLMoeForConditionalGeneration

    torch.manual_seed(1234)
    cfg._attn_implementation = "sdpa"
    if experts:
        cfg._experts_implementation = experts
        cfg.text_config._experts_implementation = experts
    model = Qwen3VLMoeForConditionalGeneration(cfg)
    return model


def special_ids(work: str) -> dict:
    tok_dir = os.path.join(work, "tokenizer")
    path = os.path.join(tok_dir, "special.json")
    if not os.path.exists(path):
        ids = make_tokenizer.write(tok_dir)
        json.dump(ids, open(path, "w"))
    return json.load(open(path))


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))


def forward_loss(model, batch: dict, dev, aux: bool):
    """Mean cross-entropy over answer tokens (+ router balance loss) and per-sample 'all answer tokens right'."""
    ids = batch["input_ids"].to(dev, non_blocking=True)
    kw = dict(input_ids=ids, attention_mask=batch["attention_mask"].to(dev, non_blocking=True),
              mm_token_type_ids=batch["mm_token_type_ids"].to(dev, non_blocking=True))
    if "patches" in batch:
        kw["pixel_values"] = data.to_pixel_values(batch["patches"].to(dev, non_blocking=True))
        kw["image_grid_thw"] = batch["image_grid_thw"].to(dev, non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        out = model(**kw, output_router_logits=aux, use_cache=False)
    labels = batch["labels"].to(dev, non_blocking=True)[:, 1:]
    logits = out.logits[:, :-1].float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    with torch.no_grad():
        ok = (logits.argmax(-1) == labels) | (labels == -100)
        exact = ok.all(dim=1)
    total = loss
    if aux and out.aux_loss is not None:
        total = loss + model.config.text_config.router_aux_loss_coef * out.aux_loss
    return total, loss, exact


def pick_experts(cfg, dev, batch, choices: list[str]) -> str:
    """Times a forward/backward of each transformers experts implementation on one real batch (no
    update) and returns the fastest that runs."""
    best, best_t = "", float("inf")
    for name in choices:
        try:
            m = build_model(cfg, name).to(dev)
            for i in range(3):
                if i == 1:
                    torch.cuda.synchronize()
                    t = time.time()
                forward_loss(m, batch, dev, True)[0].backward()
            torch.cuda.synchronize()
            dt = (time.time() - t) / 2
        except Exception as e:  # an implementation this torch/GPU lacks
            print(f"experts {name or 'eager'}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        print(f"experts {name or 'eager'}: {dt * 1000:.1f} ms a step", flush=True)
        if dt < best_t:
            best, best_t = name, dt
        del m
    return best


def probe(model, enc, dev, n: int) -> dict:
    """Teacher-forced exact match on n held-out samples per task: all answer tokens argmax-right is
    exactly the condition for greedy decoding to produce the answer."""
    model.eval()
    res = {}
    with torch.no_grad():
        for t in tasks.TASKS:
            hits = 0
            for b0 in range(0, n, 32):
                items = [enc.encode(tasks.sample(PROBE_SEED, i, t)) for i in range(b0, min(n, b0 + 32))]
                _, _, exact = forward_loss(model, data.collate(items, enc.pad, enc.image_pad), dev, False)
                hits += int(exact.sum())
            res[t] = hits / n
    model.train()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", required=True)
    ap.add_argument("--minutes", type=float, default=8.5)
    ap.add_argument("--steps", type=int, default=0, help="stop after this step (0: the schedule's end)")
    ap.add_argument("--total-steps", type=int, default=12000, help="length of the lr schedule")
    ap.add_argument("--batch", type=int, default=96)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--experts", default="auto", help="transformers experts implementation ('' = eager, auto = "
                    "the fastest of grouped_mm, batched_mm and eager on this GPU)")
    ap.add_argument("--probe", type=int, default=64, help="held-out samples per task for the progress probe")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    t_start = time.time()
    os.makedirs(a.work, exist_ok=True)
    special = special_ids(a.work)
    tok_file = os.path.join(a.work, "tokenizer", "tokenizer.json")
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    cfg = model_config(special)
    experts = a.experts
    if experts == "auto":
        enc = data.Encoder(tok_file)
        sample_batch = data.collate([enc.encode(tasks.sample(PROBE_SEED + 1, i)) for i in range(a.batch)],
                                    enc.pad, enc.image_pad)
        experts = pick_experts(cfg, dev, sample_batch, ["grouped_mm", "batched_mm", ""]) if dev.type == "cuda" else ""
    model = build_model(cfg, experts).to(dev)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    step = 0
    ckpt = os.path.join(a.work, "ckpt.pt")
    if os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print(f"resumed at step {step}", flush=True)
    else:
        n_par = sum(p.numel() for p in model.parameters())
        print(f"new model: {n_par / 1e6:.2f}M parameters", flush=True)

    end = a.steps or a.total_steps
    loader = torch.utils.data.DataLoader(data.Stream(tok_file, TRAIN_SEED, a.batch, step), batch_size=None,
                                         num_workers=a.workers, pin_memory=dev.type == "cuda", prefetch_factor=4,
                                         persistent_workers=False)
    enc = data.Encoder(tok_file)
    log = open(os.path.join(a.work, "train_log.jsonl"), "a")
    model.train()
    t0, seen, acc_loss, acc_n, acc_exact, acc_items = time.time(), 0, 0.0, 0, 0, 0
    it = iter(loader)
    while step < end:
        if time.time() - t_start > a.minutes * 60:
            break
        batch = next(it)
        lr = lr_at(step, a.total_steps, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        total, loss, exact = forward_loss(model, batch, dev, True)
        opt.zero_grad(set_to_none=True)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        acc_loss += loss.item()
        acc_n += 1
        acc_exact += int(exact.sum())
        acc_items += exact.numel()
        seen += exact.numel()
        if step % 50 == 0:
            rec = {"step": step, "loss": acc_loss / acc_n, "train_exact": acc_exact / acc_items, "lr": lr,
                   "grad_norm": float(gn), "samples_per_s": seen / (time.time() - t0), "t": time.time() - t_start}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            acc_loss, acc_n, acc_exact, acc_items = 0.0, 0, 0, 0
    del it, loader
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
    if a.probe:
        rec = {"step": step, "probe": probe(model, enc, dev, a.probe)}
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
    log.close()
    print(f"saved step {step} ({time.time() - t_start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
