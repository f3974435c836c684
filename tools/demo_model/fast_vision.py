"""A training-only replacement for transformers' Qwen3-VL vision attention without the per-image loop.

transformers (without flash-attention) splits the packed patches of all images and calls attention once
per image, every layer: hundreds of small launches a step when a batch holds hundreds of images. This
form pads the images into a few length buckets and attends each bucket in one masked call. It computes
the same function (each patch attends to the patches of its own image only); `check()` compares the two.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as qvl

_plans: dict[tuple, list] = {}


def _plan(cu_seqlens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Buckets of images (lengths within a factor 1.25 of the bucket's longest): for each, the gather
    index [n, Lmax] into the packed rows (-1 for padding), the valid-key mask [n, 1, 1, Lmax], and the
    flat positions of the valid rows."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    key = (tuple(lengths), cu_seqlens.device)
    if key in _plans:
        return _plans[key]
    starts = cu_seqlens[:-1].tolist()
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets, cur = [], []
    for i in order:
        if cur and lengths[i] * 1.25 < lengths[cur[0]]:
            buckets.append(cur)
            cur = []
        cur.append(i)
    if cur:
        buckets.append(cur)
    plan = []
    for b in buckets:
        L = lengths[b[0]]
        idx = torch.full((len(b), L), -1, dtype=torch.long)
        for r, i in enumerate(b):
            idx[r, : lengths[i]] = torch.arange(starts[i], starts[i] + lengths[i])
        valid = idx >= 0
        plan.append((idx.clamp(min=0).to(cu_seqlens.device), valid[:, None, None, :].to(cu_seqlens.device),
                     valid.to(cu_seqlens.device)))
    if len(_plans) > 64:
        _plans.clear()
    _plans[key] = plan
    return plan


def bucketed_forward(self, hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
    n = hidden_states.shape[0]
    q, k, v = self.qkv(hidden_states).reshape(n, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = qvl.apply_rotary_pos_emb_vision(q, k, cos, sin)  # [N, heads, d]
    out = q.new_zeros(q.shape)
    for idx, mask, valid in _plan(cu_seqlens):
        qb, kb, vb = (t[idx].transpose(1, 2) for t in (q, k, v))  # [n_img, heads, L, d]
        o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=self.scaling)
        o = o.transpose(1, 2)[valid]  # [rows, heads, d]
        out = out.index_copy(0, idx[valid], o.to(out.dtype))
    return self.proj(out.reshape(n, -1))


def install() -> None:
    qvl.Qwen3VLMoeVisionAttention.forward = bucketed_forward


def check(model, pixel_values, grid_thw, tol: float = 1e-4) -> float:
    """Max abs difference of the vision tower's output between transformers' attention and this one."""
    original = qvl.Qwen3VLMoeVisionAttention.forward
    with torch.no_grad():
        qvl.Qwen3VLMoeVisionAttention.forward = original
        a = model.model.visual(pixel_values, grid_thw=grid_thw).pooler_output
        qvl.Qwen3VLMoeVisionAttention.forward = bucketed_forward
        b = model.model.visual(pixel_values, grid_thw=grid_thw).pooler_output
    qvl.Qwen3VLMoeVisionAttention.forward = original
    err = (a - b).abs().max().item()
    assert err < tol, err
    return err
