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
        pats, grids = [], []
        for im in s["images"]:
            p, g = patches_u8(im)
            pats.append(p)
            grids.append(g)
        prompt = self.prompt_ids(s["content"], grids)
        answer = self.tok.encode(s["answer"], add_special_tokens=False).ids + [self.im_end]
        return {"ids": prompt + answer, "labels": [-100] * len(prompt) + answer,
                "patches": np.concatenate(pats) if pats else np.zeros((0, 3, PATCH, PATCH), np.uint8),
                "grids": grids, "task": s["task"]}


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
    return out


class Stream(torch.utils.data.IterableDataset):
    """Batches b = start, start+1, ... of the seeded sample stream; batch b holds samples b*B .. b*B+B-1.

    Worker w of n makes the batches with b % n == w; the loader interleaves workers in order, so the
    sequence of batches is the same for any number of workers.
    """

    def __init__(self, tokenizer_file: str, seed: int, batch: int, start: int, task: str | None = None):
        self.tokenizer_file, self.seed, self.batch, self.start, self.task = tokenizer_file, seed, batch, start, task

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, n = (info.id, info.num_workers) if info else (0, 1)
        enc = Encoder(self.tokenizer_file)
        b = self.start + wid
        while True:
            items = [enc.encode(tasks.sample(self.seed, b * self.batch + i, self.task)) for i in range(self.batch)]
            yield collate(items, enc.pad, enc.image_pad)
            b += n
