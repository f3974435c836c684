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
import fastmodel  # noqa: E402
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
        vocab_size=vocab, hidden_size=192, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False, max_position_embeddings=4096,
        intermediate_size=384, moe_intermediate_size=48, num_experts=16, num_experts_per_tok=4,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, router_aux_loss_coef=0.001,
        tie_word_embeddings=False, bos_token_id=special["<|endoftext|>"], eos_token_id=special["<|im_end|>"],
        pad_token_id=special["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "mrope_section": [12, 10, 10],
                         "mrope_interleaved": True},
    )
    vision = dict(
        depth=4, hidden_size=128, num_heads=4, intermediate_size=384, hidden_act="gelu_pytorch_tanh",
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


class MarkHeads(torch.nn.Module):
    """Training-only linear heads on the merged visual tokens the language model receives: the
    character in each token's left and right half, the shape in it, the word it is part of and the
    word it is the value of (data.mark_targets). They give
    the tower dense, local targets (which glyph or shape is where) long before the language model has
    learnt to ask for them; they are not part of the exported model."""

    def __init__(self, model):
        super().__init__()
        d = model.config.vision_config.out_hidden_size
        self.left = torch.nn.Linear(d, len(tasks.CHARSET) + 1)
        self.right = torch.nn.Linear(d, len(tasks.CHARSET) + 1)
        self.shape = torch.nn.Linear(d, len(tasks.SHAPE_CLASSES) + 1)
        self.word = torch.nn.Linear(d, len(tasks.WORD_LIST) + 1)
        self.key = torch.nn.Linear(d, len(tasks.WORD_LIST) + 1)

    def loss(self, merged: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        h = merged.float()
        heads = (self.left, self.right, self.shape, self.word, self.key)
        return sum(F.cross_entropy(head(h), marks[:, i]) for i, head in enumerate(heads))


def step_loss(fast, heads, b: dict, mark_weight: float, aux_coef: float):
    """Answer cross-entropy (+ router balance, + marks), and per-item 'every answer token argmax-right'
    (exactly the condition for greedy decoding to give the answer)."""
    dev = b["ids"].device
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        out = fast.forward(b, dev)
        logits = out["logits"].float()
        loss = F.cross_entropy(logits, b["tgt"])
        total = loss + aux_coef * fast.balance_loss(out["routers"])
        if heads is not None and mark_weight > 0 and out["vision"] is not None:
            total = total + mark_weight * heads.loss(out["vision"][0], b["marks"])
    with torch.no_grad():
        wrong = torch.zeros(b["n_items"], device=dev).index_add(0, b["tgt_item"], (logits.argmax(-1) != b["tgt"]).float())
        exact = wrong == 0
    return total, loss, exact


def self_check(model, fast, tok_file: str, dev, grid_side: int) -> None:
    """On this device: the packed forward against transformers (fp32, padded-bucket attention), and
    flash varlen attention against the padded-bucket form (bf16-level agreement expected)."""
    enc = data.Encoder(tok_file)
    names = ["reading", "tables", "text", "multi", "charts_all", "scenes", "reading_all", "charts"]
    items = [enc.encode(tasks.sample(PROBE_SEED + 2, i, t)) for i, t in enumerate(names)]
    hf = data.collate(items, enc.pad, enc.image_pad)
    b = data.to_device(data.collate_packed(items, enc.image_pad, grid_side), dev)
    saved = fastmodel.varlen_attn
    fastmodel.varlen_attn = None
    err = fastmodel.check(model, hf, b, dev, tol=1e-3)
    with torch.no_grad():
        ref = fast.forward(b, dev)["logits"]
        fastmodel.varlen_attn = saved
        out = fast.forward(b, dev)["logits"]
    print(json.dumps({"self_check_vs_transformers": err, "varlen_vs_padded": (out - ref).abs().max().item(),
                      "logit_std": ref.std().item(), "varlen": saved is not None}), flush=True)
    print(json.dumps({"dropped_vs_transformers": drop_check(model, fast, enc, items, dev, grid_side)}), flush=True)


def drop_check(model, fast, enc, items: list[dict], dev, grid_side: int) -> float:
    """Visual-token dropout against transformers: each item with images loses random merged tokens; the packed
    forward's logits at the scored positions must equal transformers' text model run on the kept image rows
    (their embeddings, DeepStack rows and unpruned M-RoPE positions), item by item. Max abs difference."""
    import numpy as np

    masks = data.visual_drop(items, enc.image_pad, np.random.default_rng(5), 1.0, 0.6)
    b = data.to_device(data.collate_packed(items, enc.image_pad, grid_side, masks), dev)
    saved = fastmodel.varlen_attn
    fastmodel.varlen_attn = None
    model.eval()
    worst = 0.0
    with torch.no_grad():
        fast_logits = fast.forward(b, dev)["logits"]
        fastmodel.varlen_attn = saved
        lm = model.model.language_model
        for j, x in enumerate(items):
            full = torch.tensor(x["ids"])
            keep = torch.ones(len(full), dtype=torch.bool) if masks[j] is None else torch.from_numpy(masks[j])
            ids = full[keep].to(dev)
            pos = torch.from_numpy(data.mrope_positions(x["ids"], x["grids"], enc.image_pad))[:, keep].to(dev)
            emb = lm.embed_tokens(ids)
            visual = ids == enc.image_pad
            ds = None
            if x["grids"]:
                one = data.to_device(data.collate([x], enc.pad, enc.image_pad), dev)
                feats = model.model.get_image_features(one["pixel_values"], one["image_grid_thw"], return_dict=True)
                rows = feats.pooler_output
                rows = torch.cat(rows) if isinstance(rows, (list, tuple)) else rows
                kept = keep[full == enc.image_pad].to(dev)
                emb = emb.clone()
                emb[visual] = rows[kept].to(emb.dtype)
                ds = [d[kept] for d in feats.deepstack_features]
            out = lm(input_ids=None, inputs_embeds=emb[None], position_ids=pos[:, None, :],
                     visual_pos_masks=visual[None] if ds else None, deepstack_visual_embeds=ds)
            ref = model.lm_head(out.last_hidden_state)[0]
            new_index = torch.cumsum(keep.long(), 0) - 1
            sel = new_index[torch.arange(x["n_prompt"] - 1, len(full) - 1)].to(dev)
            mine = fast_logits[(b["tgt_item"] == j).nonzero()[:, 0]]
            worst = max(worst, (mine - ref[sel]).abs().max().item())
    return worst


def probe(fast, enc, dev, n: int, grid_side: int) -> dict:
    """Teacher-forced exact match on n held-out samples of each evaluated task."""
    fast.model.eval()
    res = {}
    with torch.no_grad():
        for t in tasks.TASKS:
            hits = 0
            for b0 in range(0, n, 64):
                items = [enc.encode(tasks.sample(PROBE_SEED, i, t)) for i in range(b0, min(n, b0 + 64))]
                b = data.to_device(data.collate_packed(items, enc.image_pad, grid_side), dev)
                hits += int(step_loss(fast, None, b, 0.0, 0.0)[2].sum())
            res[t] = round(hits / n, 3)
    fast.model.train()
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
    ap.add_argument("--mark-weight", type=float, default=0.5, help="weight of the training-only mark loss")
    ap.add_argument("--drop-visual", type=float, default=0.0,
                    help="share of image samples that lose random visual tokens (VisionZip robustness)")
    ap.add_argument("--drop-max-rate", type=float, default=0.6, help="largest share of an image's tokens dropped")
    ap.add_argument("--drop-marked-weight", type=float, default=1.0,
                    help="odds of dropping a token with content (a mark) against a background token")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--self-check", action="store_true", help="compare the packed forward with transformers first")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
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
    grid_side = int(cfg.vision_config.num_position_embeddings ** 0.5)
    model = build_model(cfg, "").to(dev)
    fast = fastmodel.Fast(model)
    heads = MarkHeads(model).to(dev)
    named = list(model.named_parameters()) + [("heads." + n, p) for n, p in heads.named_parameters()]
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    step = 0
    ckpt = os.path.join(a.work, "ckpt.pt")
    if os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        model.load_state_dict(st["model"])
        heads.load_state_dict(st["heads"])
        opt.load_state_dict(st["opt"])
        step = st["step"]
        print(f"resumed at step {step}", flush=True)
    else:
        n_par = sum(p.numel() for p in model.parameters())
        print(f"new model: {n_par / 1e6:.2f}M parameters", flush=True)

    if a.self_check:
        self_check(model, fast, tok_file, dev, grid_side)
    end = a.steps or a.total_steps
    loader = torch.utils.data.DataLoader(data.Stream(tok_file, TRAIN_SEED, a.batch, step, grid_side,
                                                                     drop_share=a.drop_visual,
                                                                     drop_max_rate=a.drop_max_rate,
                                                                     drop_marked_weight=a.drop_marked_weight),
                                         batch_size=None,
                                         num_workers=a.workers, pin_memory=dev.type == "cuda", prefetch_factor=4,
                                         persistent_workers=False)
    enc = data.Encoder(tok_file)
    log = open(os.path.join(a.work, "train_log.jsonl"), "a")
    model.train()
    aux = cfg.text_config.router_aux_loss_coef
    t0, seen, acc = time.time(), 0, {"loss": 0.0, "total": 0.0, "n": 0}
    per_task: dict[str, list[int]] = {}
    it = iter(loader)
    wait, busy = 0.0, 0.0
    while step < end:
        if time.time() - t_start > a.minutes * 60:
            break
        tw = time.time()
        b = data.to_device(next(it), dev)
        wait += time.time() - tw
        ts = time.time()
        lr = lr_at(step, a.total_steps, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        total, loss, exact = step_loss(fast, heads, b, a.mark_weight, aux)
        opt.zero_grad(set_to_none=True)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        acc["loss"] += loss.item()
        acc["total"] += total.item()
        acc["n"] += 1
        for t, e in zip(b["tasks"], exact.tolist()):
            per_task.setdefault(t, [0, 0])
            per_task[t][0] += int(e)
            per_task[t][1] += 1
        seen += b["n_items"]
        busy += time.time() - ts  # the step on the device (the .item() calls above wait for it)
        if step % a.log_every == 0:
            rec = {"step": step, "loss": round(acc["loss"] / acc["n"], 4), "total": round(acc["total"] / acc["n"], 4),
                   "train_exact": {t: round(h / max(1, n), 3) for t, (h, n) in sorted(per_task.items())},
                   "lr": lr, "grad_norm": round(float(gn), 3), "samples_per_s": round(seen / (time.time() - t0)),
                   "data_wait_s": round(wait, 1), "step_ms": round(1000 * busy / acc["n"], 1),
                   "t": round(time.time() - t_start)}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
            acc, per_task, busy = {"loss": 0.0, "total": 0.0, "n": 0}, {}, 0.0
    del it, loader
    torch.save({"model": model.state_dict(), "heads": heads.state_dict(), "opt": opt.state_dict(), "step": step},
               ckpt + ".tmp")
    os.replace(ckpt + ".tmp", ckpt)
    if a.probe:
        rec = {"step": step, "probe": probe(fast, enc, dev, a.probe, grid_side)}
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
    log.close()
    print(f"saved step {step} ({time.time() - t_start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
