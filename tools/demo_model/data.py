"""Turns task samples into model inputs: chat text, token ids, answer labels and image patches.

The prompt is Qwen3-VL's chat template (user turn, generation prompt) with one <|image_pad|> per
merged 2x2 patch block, exactly what the transformers processor builds for images whose sides are
multiples of 32. Patches leave the workers as uint8 (a quarter of float32's bytes); `to_pixel_values`
normalises them on the GPU into the processor's pixel_values rows.
"""
from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer

import tasks

PATCH = 16
MERGE = 2


def chat_prompt(content: list[dict]) -> str:
    """The Qwen3-VL template's rendering of one user message plus the generation prompt."""
    parts = []
    for p in content:
        parts.append("<|vision_start|><|image_pad|><|vision_end|>" if p["type"] == "image" else p["text"])
    return "<|im_start|>user\n" + "".join(parts) + "<|im_end|>\n<|im_start|>assistant\n"


def patches_u8(im) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 RGB image -> patches [N, 3, 16, 16] in the processor's 2x2-block order, and (t, h, w)."""
    a = np.asarray(im.convert("RGB"), dtype=np.uint8)
    H, W = a.shape[:2]
    assert H % (PATCH * MERGE) == 0 and W % (PATCH * MERGE) == 0, (H, W)
    gh, gw = H // PATCH, W // PATCH
    x = a.reshape(gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH, 3)  # br ir py bc ic px ch
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # br bc ir ic ch py px
    return np.ascontiguousarray(x.reshape(gh * gw, 3, PATCH, PATCH)), (1, gh, gw)


def to_pixel_values(p: torch.Tensor, temporal: int = 2) -> torch.Tensor:
    """uint8 patches [N, 3, 16, 16] -> float32 pixel_values [N, 3*T*16*16] (rescale 1/255, mean/std 0.5)."""
    x = (p.float() * (1.0 / 255.0) - 0.5) / 0.5
    return x.unsqueeze(2).expand(-1, -1, temporal, -1, -1).reshape(p.shape[0], -1)


def mark_targets(marks: list, grid: tuple[int, int, int]) -> np.ndarray:
    """Per merged token (the processor's order): [character in its left half, character in its right
    half, shape, word, key] as class ids (tasks.CHAR_ID, tasks.SHAPE_ID, tasks.WORD_ID; 0 for none)."""
    _, gh, gw = grid
    tw = gw // MERGE
    out = np.zeros((gh * gw // (MERGE * MERGE), 5), np.int64)
    for cx, cy, kind, c, word, key in marks:
        px = min(gw - 1, max(0, int(cx // PATCH)))
        py = min(gh - 1, max(0, int(cy // PATCH)))
        tok = (py // MERGE) * tw + px // MERGE
        out[tok, (px % MERGE) if kind == "c" else 2] = c
        if word:
            out[tok, 3] = word
        if key:
            out[tok, 4] = key
    return out


class Encoder:
    def __init__(self, tokenizer_file: str):
        self.tok = Tokenizer.from_file(tokenizer_file)
        self.image_pad = self.tok.token_to_id("<|image_pad|>")
        self.im_end = self.tok.token_to_id("<|im_end|>")
        self.pad = self.tok.token_to_id("<|endoftext|>")

    def prompt_ids(self, content: list[dict], grids: list[tuple[int, int, int]]) -> list[int]:
        ids = self.tok.encode(chat_prompt(content), add_special_tokens=False).ids
        out, k = [], 0
        for t in ids:
            if t == self.image_pad:
                _, h, w = grids[k]
                out.extend([t] * (h * w // (MERGE * MERGE)))
                k += 1
            else:
                out.append(t)
        assert k == len(grids)
        return out

    def encode(self, s: dict) -> dict:
        """One sample -> ids, labels (answer tokens and <|im_end|>; -100 elsewhere), patches, grids."""
        pats, grids, mm = [], [], []
        for im, marks in zip(s["images"], s["marks"]):
            p, g = patches_u8(im)
            pats.append(p)
            grids.append(g)
            mm.append(mark_targets(marks, g))
        prompt = self.prompt_ids(s["content"], grids)
        answer = self.tok.encode(s["answer"], add_special_tokens=False).ids + [self.im_end]
        return {"ids": prompt + answer, "labels": [-100] * len(prompt) + answer,
                "patches": np.concatenate(pats) if pats else np.zeros((0, 3, PATCH, PATCH), np.uint8),
                "marks": np.concatenate(mm) if mm else None, "grids": grids, "task": s["task"],
                "n_prompt": len(prompt)}


def mrope_positions(ids: list[int], grids: list[tuple[int, int, int]], image_pad_id: int) -> np.ndarray:
    """[3, T] M-RoPE positions (transformers' get_rope_index for one unpadded sequence): text tokens
    count up on all three axes; an image's tokens sit at (p, p + row, p + col) from the position p
    where it starts, and text resumes at p + max(rows, cols)."""
    out = np.zeros((3, len(ids)), np.int64)
    cur, i, k = 0, 0, 0
    while i < len(ids):
        if ids[i] != image_pad_id:
            out[:, i] = cur
            cur += 1
            i += 1
            continue
        _, gh, gw = grids[k]
        h, w = gh // MERGE, gw // MERGE
        rows, cols = np.divmod(np.arange(h * w), w)
        out[0, i:i + h * w] = cur
        out[1, i:i + h * w] = cur + rows
        out[2, i:i + h * w] = cur + cols
        cur += max(h, w)
        i += h * w
        k += 1
    return out


def visual_drop(items: list[dict], image_pad_id: int, rng: np.random.Generator, share: float,
                max_rate: float, marked_weight: float = 1.0) -> list[np.ndarray | None]:
    """Per item, the mask of its tokens that stay (None: all): with probability `share` an item with images
    loses a random rate in [0, max_rate] of each image's merged tokens (training-time visual-token dropout,
    so the model tolerates the prompts VisionZip prunes). A token that carries a mark (a character, shape,
    word or key) is drawn with `marked_weight` times the odds of a background token: VisionZip drops
    mostly background, and the model should not lean on it."""
    masks: list[np.ndarray | None] = []
    for x in items:
        if not x["grids"] or rng.random() >= share:
            masks.append(None)
            continue
        ids = np.asarray(x["ids"])
        keep = np.ones(len(ids), dtype=bool)
        pads = np.flatnonzero(ids == image_pad_id)
        at = 0
        for t, h, w in x["grids"]:
            m = t * h * w // (MERGE * MERGE)
            k = int(m * rng.uniform(0.0, max_rate))
            odds = np.where(x["marks"][at:at + m].any(axis=1), marked_weight, 1.0) if x["marks"] is not None \
                else np.ones(m)
            keep[pads[at + rng.choice(m, size=k, replace=False, p=odds / odds.sum())]] = False
            at += m
        masks.append(keep)
    return masks


def collate_packed(items: list[dict], image_pad_id: int, grid_side: int,
                   keep_masks: list[np.ndarray | None] | None = None) -> dict:
    """Packs samples end to end for fastmodel: token ids [N], M-RoPE positions [3, N], cu_seq, the
    scored positions (each predicts the next token) and their targets, the image tokens' positions, the
    patches with their vision rotary positions and position-embedding interpolation taps, cu_img, marks.
    keep_masks (visual_drop): dropped image tokens leave the sequence, the others keep their M-RoPE
    positions, and `vis_keep` lists the merged rows (of all images, in order) that stay."""
    ids, pos, tgt_pos, tgt, tgt_item, img_pos, cu, vis_keep = [], [], [], [], [], [], [0], []
    row = 0
    for j, x in enumerate(items):
        base = cu[-1]
        full = np.asarray(x["ids"])
        p3 = mrope_positions(x["ids"], x["grids"], image_pad_id)
        keep = keep_masks[j] if keep_masks and keep_masks[j] is not None else np.ones(len(full), dtype=bool)
        pads = full == image_pad_id
        vis_keep.extend(row + np.flatnonzero(keep[pads]))
        row += int(pads.sum())
        new_index = np.cumsum(keep) - 1  # position of each kept token in the shortened sequence
        seq = full[keep].tolist()
        n = len(seq)
        ids.extend(seq)
        pos.append(p3[:, keep])
        for t in range(x["n_prompt"] - 1, len(full) - 1):  # the answer: never dropped
            tgt_pos.append(base + int(new_index[t]))
            tgt.append(int(full[t + 1]))
            tgt_item.append(j)
        img_pos.extend(base + t for t in range(n) if seq[t] == image_pad_id)
        cu.append(base + n)
    out = {"ids": torch.tensor(ids), "pos3": torch.from_numpy(np.concatenate(pos, axis=1)),
           "cu_seq": torch.tensor(cu, dtype=torch.int32), "max_seq": max(len(x["ids"]) for x in items),
           "tgt_pos": torch.tensor(tgt_pos), "tgt": torch.tensor(tgt), "tgt_item": torch.tensor(tgt_item),
           "n_items": len(items), "tasks": [x["task"] for x in items]}
    grids = [g for x in items for g in x["grids"]]
    if grids:
        thw = torch.tensor(grids, dtype=torch.long)
        per = [_vision_indices(tuple(g), grid_side) for g in grids]
        counts = [t * h * w_ for t, h, w_ in grids]
        out.update({
            "patches": torch.from_numpy(np.concatenate([x["patches"] for x in items if x["grids"]])),
            "vis_pos": torch.cat([p[0] for p in per]), "interp_idx": torch.cat([p[1] for p in per]),
            "interp_w": torch.cat([p[2] for p in per]),
            "cu_img": torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32),
            "max_img": max(counts), "img_pos": torch.tensor(img_pos),
            "marks": torch.from_numpy(np.concatenate([x["marks"] for x in items if x["grids"]])),
            "image_grid_thw": thw})
        if len(vis_keep) < row:
            out["vis_keep"] = torch.tensor(np.asarray(vis_keep, dtype=np.int64))
    return out


_vision_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _vision_indices(grid: tuple[int, int, int], grid_side: int):
    """One image's vision rotary positions and position-embedding interpolation taps (transformers'
    helpers, computed once per image size)."""
    key = (grid, grid_side)
    if key not in _vision_cache:
        from transformers import vision_utils as vu

        thw = torch.tensor([grid], dtype=torch.long)
        idx, w = vu.get_vision_interpolation_indices_and_weights(thw, num_grid_per_side=grid_side, mode="bilinear",
                                                                  align_corners=True, spatial_merge_size=MERGE)
        _vision_cache[key] = (vu.get_vision_position_ids(thw, MERGE), idx, w.float())
    return _vision_cache[key]


def to_device(b: dict, dev) -> dict:
    out = {k: (v.to(dev, non_blocking=True) if torch.is_tensor(v) else v) for k, v in b.items()}
    if "patches" in out:
        out["pixel_values"] = to_pixel_values(out["patches"])
    return out


def collate(items: list[dict], pad_id: int, image_pad_id: int) -> dict:
    T = max(len(x["ids"]) for x in items)
    B = len(items)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    for i, x in enumerate(items):  # right padding: training and teacher-forced scoring only
        n = len(x["ids"])
        ids[i, :n] = torch.tensor(x["ids"])
        labels[i, :n] = torch.tensor(x["labels"])
        mask[i, :n] = 1
    grids = [g for x in items for g in x["grids"]]
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels,
           "mm_token_type_ids": (ids == image_pad_id).to(torch.int32),
           "tasks": [x["task"] for x in items]}
    if grids:
        out["patches"] = torch.from_numpy(np.concatenate([x["patches"] for x in items]))
        out["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
        out["pixel_values"] = to_pixel_values(out["patches"])
    return out


class Stream(torch.utils.data.IterableDataset):
    """Batches b = start, start+1, ... of the seeded sample stream; batch b holds samples b*B .. b*B+B-1.

    Worker w of n makes the batches with b % n == w; the loader interleaves workers in order, so the
    sequence of batches is the same for any number of workers.
    """

    def __init__(self, tokenizer_file: str, seed: int, batch: int, start: int, grid_side: int, task: str | None = None,
                 drop_share: float = 0.0, drop_max_rate: float = 0.6, drop_marked_weight: float = 1.0):
        self.tokenizer_file, self.seed, self.batch, self.start, self.task = tokenizer_file, seed, batch, start, task
        self.grid_side, self.drop_share, self.drop_max_rate = grid_side, drop_share, drop_max_rate
        self.drop_marked_weight = drop_marked_weight

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        enc = Encoder(self.tokenizer_file)
        b = self.start + wid
        while True:
            items = [enc.encode(tasks.sample(self.seed, b * self.batch + i, self.task)) for i in range(self.batch)]
            masks = None
            if self.drop_share > 0:  # a function of (seed, batch), like the samples
                rng = np.random.default_rng([self.seed, b, 7])
                masks = visual_drop(items, enc.image_pad, rng, self.drop_share, self.drop_max_rate,
                                    self.drop_marked_weight)
            yield collate_packed(items, enc.image_pad, self.grid_side, masks)
            b += n
