"""Writes the held-out evaluation split (a seed the training stream never uses) as zest eval data.

    python3 tools/demo_model/make_eval.py --out DIR [--per-task 200]

DIR/eval.jsonl has one OpenAI chat-completions body a line plus "answer" and "task"; images are PNG
files in DIR/images/, named relative to the JSONL.
"""
from __future__ import annotations

import argparse
import json
import os

import tasks

EVAL_SEED = 2  # training uses 1, the training probe 99
TEXT_ITEMS = 100


def to_body(s: dict, name: str) -> dict:
    parts = []
    for p in s["content"]:
        if p["type"] == "image":
            parts.append({"type": "image_url", "image_url": {"url": f"images/{name}_{p['index']}.png"}})
        else:
            parts.append({"type": "text", "text": p["text"]})
    return {"messages": [{"role": "user", "content": parts}], "answer": s["answer"], "task": s["task"]}


def write(out: str, per_task: int, seed: int = EVAL_SEED) -> int:
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    n = 0
    with open(os.path.join(out, "eval.jsonl"), "w", encoding="utf-8") as f:
        for t in tasks.TASKS:
            for i in range(min(per_task, TEXT_ITEMS) if t == "text" else per_task):
                s = tasks.sample(seed, i, t)
                name = f"{t}_{i:04d}"
                for j, im in enumerate(s["images"]):
                    im.save(os.path.join(out, "images", f"{name}_{j}.png"), optimize=True)
                f.write(json.dumps(to_body(s, name), ensure_ascii=False) + "\n")
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-task", type=int, default=200)
    ap.add_argument("--seed", type=int, default=EVAL_SEED,
                    help="another seed gives another split (99: calibration data for zest sere-protect)")
    a = ap.parse_args()
    print(f"{write(a.out, a.per_task, a.seed)} items in {a.out}/eval.jsonl")


if __name__ == "__main__":
    main()
