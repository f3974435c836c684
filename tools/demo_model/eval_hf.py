"""Greedy answers of transformers on eval data (the reference zest's answers are compared with).

    python3 tools/demo_model/eval_hf.py --model DIR --data eval.jsonl --out hf_predictions.jsonl
    python3 tools/demo_model/eval_hf.py --compare A.jsonl B.jsonl   # agreement of two prediction files

Writes one {"index", "task", "prediction", "answer", "correct"} a line and prints exact-match accuracy
per task. Items run one at a time in float32, so no padding enters the reference.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def normalise(s: str) -> str:
    return " ".join(s.strip().lower().split()).rstrip(".")


def accepted(item: dict) -> list[str]:
    a = item["answer"]
    return a if isinstance(a, list) else [a]


def table(rows: list[dict]) -> str:
    by = defaultdict(list)
    for r in rows:
        by[r["task"]].append(r["correct"])
    lines = ["| task | items | exact match |", "|---|---|---|"]
    for t, v in by.items():
        lines.append(f"| {t} | {len(v)} | {100.0 * sum(v) / len(v):.1f}% |")
    allv = [r["correct"] for r in rows]
    lines.append(f"| all | {len(allv)} | {100.0 * sum(allv) / len(allv):.1f}% |")
    return "\n".join(lines)


def run(model_dir: str, data: str, out: str, limit: int, device: str) -> None:
    import torch
    from PIL import Image
    from transformers import AutoProcessor, Qwen3VLMoeForConditionalGeneration

    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    proc = AutoProcessor.from_pretrained(model_dir)
    base = os.path.dirname(os.path.abspath(data))
    items = load(data)[: limit or None]
    rows = []
    for i, it in enumerate(items):
        msgs, images = [], []
        for m in it["messages"]:
            parts = []
            for p in m["content"]:
                if p["type"] == "image_url":
                    images.append(Image.open(os.path.join(base, p["image_url"]["url"])).convert("RGB"))
                    parts.append({"type": "image"})
                else:
                    parts.append(p)
            msgs.append({"role": m["role"], "content": parts})
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        inp = proc(text=[text], images=images or None, return_tensors="pt").to(device)
        with torch.no_grad():
            out_ids = model.generate(**inp, max_new_tokens=it.get("max_tokens", 32), do_sample=False)
        pred = proc.decode(out_ids[0, inp["input_ids"].shape[1]:], skip_special_tokens=True)
        ok = any(normalise(pred) == normalise(a) for a in accepted(it))
        rows.append({"index": i, "task": it.get("task", ""), "prediction": pred, "answer": it["answer"], "correct": ok})
        if (i + 1) % 100 == 0:
            print(f"{i + 1}/{len(items)}", flush=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(table(rows))


def compare(a: str, b: str) -> None:
    ra, rb = load(a), load(b)
    assert len(ra) == len(rb), (len(ra), len(rb))
    same = sum(x["prediction"] == y["prediction"] for x, y in zip(ra, rb))
    print(f"identical answers: {same}/{len(ra)} = {100.0 * same / len(ra):.1f}%")
    for x, y in zip(ra, rb):
        if x["prediction"] != y["prediction"]:
            print(f"  item {x['index']} ({x['task']}): {x['prediction']!r} vs {y['prediction']!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--out")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compare", nargs=2)
    a = ap.parse_args()
    if a.compare:
        compare(*a.compare)
    else:
        run(a.model, a.data, a.out, a.limit, a.device)


if __name__ == "__main__":
    main()
