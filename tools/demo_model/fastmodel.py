"""The demo model's training forward: transformers' Qwen3-VL-MoE, computed over packed sequences.

The parameters live in transformers' `Qwen3VLMoeForConditionalGeneration` (so export and every check
use the real model); this module only computes the same function faster for training:

- every per-sample index (M-RoPE positions, vision rotary positions, position-embedding
  interpolation taps, attention boundaries) is computed by the data workers (`data.collate`), so a
  step has no Python loop over samples or images;
- the batch is packed (no padding): the language model attends with variable-length causal
  attention over `cu_seq`, the vision tower with variable-length full attention over `cu_img`
  (flash attention through `torch.nn.attention.varlen`; a padded-bucket form elsewhere);
- the experts run densely: every expert on every token, weighted by the router's renormalised top-k
  weights scattered into a dense [tokens, experts] matrix (zero for unselected experts), which is
  the same sum transformers computes, with the same gradients, in three batched matrix products
  instead of a routing loop;
- logits only where a target is scored.

`check()` compares it with transformers' own forward on a real batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # flash attention over packed sequences (PyTorch >= 2.10; its keywords changed between releases)
    import inspect

    from torch.nn.attention.varlen import varlen_attn
    _VARLEN_ARGS = set(inspect.signature(varlen_attn).parameters)
except ImportError:  # pragma: no cover
    varlen_attn, _VARLEN_ARGS = None, set()


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dt = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _buckets(cu: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences grouped by length (within a factor 1.25): gather index [n, L] (clamped) and valid mask."""
    lengths = (cu[1:] - cu[:-1]).tolist()
    starts = cu[:-1].tolist()
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, cur = [], []
    for i in order:
        if lengths[i] == 0:
            continue
        if cur and lengths[i] * 1.25 < lengths[cur[0]]:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    out = []
    for g in groups:
        L = lengths[g[0]]
        idx = torch.full((len(g), L), -1, dtype=torch.long)
        for r, i in enumerate(g):
            idx[r, : lengths[i]] = torch.arange(starts[i], starts[i] + lengths[i])
        out.append((idx.clamp(min=0).to(cu.device), (idx >= 0).to(cu.device)))
    return out


def packed_attention(q, k, v, cu: torch.Tensor, max_len: int, causal: bool, scale: float) -> torch.Tensor:
    """q [N, Hq, D], k/v [N, Hkv, D] packed by cu (int32 [S+1]); attention within each sequence."""
    if varlen_attn is not None and q.is_cuda:
        dt = torch.bfloat16
        kw = {"scale": scale}
        if "window_size" in _VARLEN_ARGS:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kw["is_causal"] = causal
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in _VARLEN_ARGS:
                kw["enable_gqa"] = True
            else:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return varlen_attn(q.to(dt), k.to(dt), v.to(dt), cu, cu, max_len, max_len, **kw)
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = q.new_zeros(q.shape)
    for idx, valid in _buckets(cu):
        qb, kb, vb = (t[idx].transpose(1, 2) for t in (q, k, v))  # [n, H, L, D]
        L = idx.shape[1]
        mask = valid[:, None, None, :]
        if causal:
            mask = mask & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()[None, None]
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale).transpose(1, 2)
        out = out.index_copy(0, idx[valid], o[valid].to(out.dtype))
    return out


class Fast:
    """The training forward over a transformers Qwen3VLMoeForConditionalGeneration's parameters."""

    def __init__(self, model):
        self.model = model
        self.cfg = model.config
        self.tc, self.vc = self.cfg.text_config, self.cfg.vision_config
        tc = self.tc
        hd = tc.head_dim
        theta = tc.rope_parameters["rope_theta"]
        self.text_inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
        self.mrope_section = tc.rope_parameters["mrope_section"]
        vhd = self.vc.hidden_size // self.vc.num_heads
        vtheta = self.vc.rope_parameters["rope_theta"] if getattr(self.vc, "rope_parameters", None) else 10000.0
        sd = vhd // 2
        self.vis_inv_freq = 1.0 / (vtheta ** (torch.arange(0, sd, 2, dtype=torch.float) / sd))

    # -- vision -------------------------------------------------------------------------------------

    def vision(self, pixel_values, vis_pos, interp_idx, interp_w, cu_img, max_img):
        """Packed patches [P, C*T*p*p] -> merged tokens [P/4, out], deepstack features, last block output."""
        vis = self.model.model.visual
        vc = self.vc
        D, H = vc.hidden_size, vc.num_heads
        w = vis.patch_embed.proj.weight
        x = F.linear(pixel_values.to(w.dtype), w.reshape(D, -1), vis.patch_embed.proj.bias)
        pos = (vis.pos_embed(interp_idx) * interp_w[:, :, None]).sum(1)
        x = x + pos.to(x.dtype)
        freqs = vis_pos[:, :, None].float() * self.vis_inv_freq.to(x.device)  # [P, 2, sd/2]
        f = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        f = torch.cat([f, f], dim=-1)[:, None, :]  # [P, 1, hd]
        cos, sin = f.cos(), f.sin()
        deep = []
        hd = D // H
        for i, blk in enumerate(vis.blocks):
            h = blk.norm1(x)
            qkv = blk.attn.qkv(h).reshape(-1, 3, H, hd)
            q, k, v = qkv.unbind(1)
            qf, kf = q.float(), k.float()
            q = (qf * cos + rotate_half(qf) * sin).to(q.dtype)
            k = (kf * cos + rotate_half(kf) * sin).to(k.dtype)
            o = packed_attention(q, k, v, cu_img, max_img, False, hd ** -0.5)
            x = x + blk.attn.proj(o.reshape(-1, D).to(h.dtype))
            x = x + blk.mlp(blk.norm2(x))
            if i in vc.deepstack_visual_indexes:
                deep.append(vis.deepstack_merger_list[vc.deepstack_visual_indexes.index(i)](x))
        return vis.merger(x), deep, x

    # -- language model -------------------------------------------------------------------------------

    def rope(self, pos3: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """pos3 [3, N] -> interleaved M-RoPE cos/sin [N, 1, head_dim] (t everywhere, h and w on every
        third frequency from 1 and 2, within their sections), as transformers composes them."""
        freqs = pos3[:, :, None].float() * self.text_inv_freq.to(pos3.device)  # [3, N, hd/2]
        f = freqs[0].clone()
        for dim, off in ((1, 1), (2, 2)):
            sl = slice(off, self.mrope_section[dim] * 3, 3)
            f[:, sl] = freqs[dim][:, sl]
        f = torch.cat([f, f], dim=-1)[:, None, :]
        return f.cos().to(dtype), f.sin().to(dtype)

    def moe(self, mlp, x: torch.Tensor):
        """Dense form of the sparse MoE block: returns output and router logits."""
        logits = F.linear(x, mlp.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, idx = torch.topk(probs, self.tc.num_experts_per_tok, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        dense = torch.zeros_like(probs).scatter(1, idx, top).to(logits.dtype)  # [N, E]
        E, I2, Hd = mlp.experts.gate_up_proj.shape
        gu = F.linear(x, mlp.experts.gate_up_proj.reshape(E * I2, Hd)).view(-1, E, I2)
        g, u = gu.chunk(2, dim=-1)
        a = F.silu(g) * u * dense[:, :, None].to(u.dtype)  # [N, E, I]
        wd = mlp.experts.down_proj.permute(1, 0, 2).reshape(Hd, E * (I2 // 2))  # [H, E*I]
        out = F.linear(a.reshape(a.shape[0], -1), wd)
        return out, logits, probs, idx

    def forward(self, b: dict, dev) -> dict:
        """b: a collated batch (data.collate) already on dev. Returns logits at the scored positions,
        their targets, the router statistics and the vision outputs."""
        lm = self.model.model.language_model
        tc = self.tc
        ids = b["ids"]
        x = lm.embed_tokens(ids)
        ds = None
        vis_out = None
        if "patches" in b:
            merged, deep, last = self.vision(b["pixel_values"], b["vis_pos"], b["interp_idx"], b["interp_w"],
                                             b["cu_img"], b["max_img"])
            vis_out = (merged, last)  # every merged row: the mark heads see them all
            if "vis_keep" in b:  # visual-token dropout: only the kept rows enter the sequence
                merged = merged[b["vis_keep"]]
                deep = [d[b["vis_keep"]] for d in deep]
            x = x.index_copy(0, b["img_pos"], merged.to(x.dtype))
            ds = deep
        cos, sin = self.rope(b["pos3"], x.dtype)
        nh, nkv, hd = tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim
        routers = []
        for li, layer in enumerate(lm.layers):
            at = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, tc.rms_norm_eps)
            q = rms_norm(at.q_proj(h).view(-1, nh, hd), at.q_norm.weight, tc.rms_norm_eps)
            k = rms_norm(at.k_proj(h).view(-1, nkv, hd), at.k_norm.weight, tc.rms_norm_eps)
            v = at.v_proj(h).view(-1, nkv, hd)
            q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
            k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
            o = packed_attention(q, k, v, b["cu_seq"], b["max_seq"], True, hd ** -0.5)
            x = x + at.o_proj(o.reshape(-1, nh * hd).to(h.dtype))
            h = rms_norm(x, layer.post_attention_layernorm.weight, tc.rms_norm_eps)
            m, logits, probs, idx = self.moe(layer.mlp, h)
            routers.append((probs, idx))
            x = x + m
            if ds is not None and li < len(ds):
                x = x.index_add(0, b["img_pos"], ds[li].to(x.dtype))
        sel = b["tgt_pos"]
        h = rms_norm(x[sel], lm.norm.weight, tc.rms_norm_eps)
        logits = self.model.lm_head(h)
        return {"logits": logits, "targets": b["tgt"], "routers": routers, "vision": vis_out}

    def balance_loss(self, routers) -> torch.Tensor:
        """Switch-style load balancing over all layers (transformers' load_balancing_loss_func)."""
        E = self.tc.num_experts
        probs = torch.cat([p for p, _ in routers])
        idx = torch.cat([i for _, i in routers])
        frac = F.one_hot(idx, E).float().mean(0)  # [k, E]
        return E * (frac * probs.mean(0)[None]).sum()


def check(model, batch_hf: dict, batch_fast: dict, dev, tol: float = 2e-4) -> float:
    """Max abs difference between transformers' logits and this forward's at the scored positions."""
    model.eval()
    with torch.no_grad():
        kw = {k: batch_hf[k].to(dev) for k in ("input_ids", "attention_mask", "mm_token_type_ids")}
        if "pixel_values" in batch_hf:
            kw["pixel_values"] = batch_hf["pixel_values"].to(dev)
            kw["image_grid_thw"] = batch_hf["image_grid_thw"].to(dev)
        ref = model(**kw, use_cache=False).logits  # [B, T, V]
        mask = batch_hf["attention_mask"].bool()
        labels = batch_hf["labels"]
        # scored positions: position t predicts label t+1
        want = torch.zeros_like(mask)
        want[:, :-1] = labels[:, 1:] != -100
        ref_sel = ref[want.to(ref.device)]
        out = Fast(model).forward({k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in batch_fast.items()}, dev)
    err = (ref_sel - out["logits"]).abs().max().item()
    model.train()
    assert err < tol, err
    return err
