"""Assembles the shipped demo model folder from an exported model and its measured evaluation.

    python3 tools/demo_model/ship.py --model EXPORTED --eval-dir DIR --hf DIR/hf.jsonl \
        --zest-report DIR/zest_cpu.md [--cuda-report DIR/zest_cuda.md] --log train_log.jsonl \
        --out models/zest-demo-vl

DIR is make_eval.py's output (eval.jsonl + images/), hf.jsonl eval_hf.py's transformers answers on it,
the reports `zest eval --out` files. The folder gets the model files, `examples/` (the first held-out
item of each image task that transformers answers right, with its images: the CI test and the
quickstart ask zest about them), `eval/` (the held-out set's questions and answers with the SHA-256 of
every image; make_eval.py draws the images again) and README.md, the model card.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

MODEL_FILES = ["config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja"]
EXAMPLE_TASKS = ["reading", "tables", "charts", "scenes", "multi"]


def load(path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def images_of(body: dict) -> list[str]:
    return [p["image_url"]["url"] for m in body["messages"] for p in (m["content"] if isinstance(m["content"], list) else [])
            if p.get("type") == "image_url"]


def task_table(report: str) -> dict[str, str]:
    """Exact-match % per task and overall from a `zest eval` markdown report (its first setting)."""
    out, section = {}, None
    for line in report.splitlines():
        m = re.match(r"## (Overall|Task (\w+))", line)
        if m:
            section = m.group(2) or "all"
            continue
        if section and line.startswith("| ") and not line.startswith("| setting") and section not in out:
            out[section] = line.split("|")[3].strip()
    return out


def chunk_ends(log: list[dict]) -> list[float]:
    """The seconds each training chunk ran: a chunk's clock `t` restarts when the next one resumes."""
    ends, last = [], None
    for r in log:
        if "t" not in r:
            continue
        if last is not None and r["t"] < last:
            ends.append(last)
        last = r["t"]
    return ends + ([last] if last is not None else [])


def train_minutes(log: list[dict]) -> float:
    return sum(chunk_ends(log)) / 60


def chunks(log: list[dict]) -> int:
    return len(chunk_ends(log))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--eval-dir", required=True)
    ap.add_argument("--hf", required=True)
    ap.add_argument("--zest-report", required=True)
    ap.add_argument("--cuda-report")
    ap.add_argument("--agreement", default="", help="text of eval_hf.py --compare for the record")
    ap.add_argument("--log", required=True)
    ap.add_argument("--train-command", default="", help="the gpu_train.sh command the weights came from (for the card)")
    ap.add_argument("--visionzip", help="zest calibrate-visionzip's visionzip.json (the model's VisionZip score block)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    src, out, ev = Path(a.model), Path(a.out), Path(a.eval_dir)
    if out.exists():
        shutil.rmtree(out)
    (out / "examples").mkdir(parents=True)
    (out / "eval").mkdir()
    for f in MODEL_FILES + sorted(p.name for p in src.glob("model*.safetensors*")):
        shutil.copy(src / f, out / f)
    vz = json.loads(Path(a.visionzip).read_text()) if a.visionzip else None
    vz_line = ""
    if vz:
        shutil.copy(a.visionzip, out / "visionzip.json")
        blocks = ", ".join(f"block {b['score_layer']}: {100 * b['exact']:.1f}%" for b in vz["blocks"])
        vz_line = (f"- `visionzip.json`: VisionZip's score block for this model, {vz['score_layer']}, chosen by\n"
                   f"  `zest calibrate-visionzip --rate {vz['rate']}` on {vz['items']} items of a calibration split\n"
                   f"  (seed 99; exact match at each block: {blocks}); zest reads it as the model's\n"
                   f"  default (`--vision-score-layer` overrides it). docs/quality.md has the trade-offs.\n")

    items = load(ev / "eval.jsonl")
    hf = load(a.hf)
    examples = []
    for task in EXAMPLE_TASKS:
        for it, ref in zip(items, hf):
            if it["task"] == task and ref["correct"]:
                body = json.loads(json.dumps(it))
                for p in (p for m in body["messages"] for p in m["content"] if p.get("type") == "image_url"):
                    name = os.path.basename(p["image_url"]["url"])
                    shutil.copy(ev / p["image_url"]["url"], out / "examples" / name)
                    p["image_url"]["url"] = name
                examples.append(body)
                break
    with open(out / "examples" / "examples.jsonl", "w", encoding="utf-8") as f:
        for e in examples:
            f.write(json.dumps(e, ensure_ascii=False) + "\n")

    with open(out / "eval" / "eval.jsonl", "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    with open(out / "eval" / "images.sha256", "w") as f:
        for p in sorted((ev / "images").iterdir()):
            f.write(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  images/{p.name}\n")

    cfg = json.load(open(src / "config.json"))
    log = [r for r in load(a.log) if "loss" in r]
    probe = [r for r in load(a.log) if "probe" in r]
    n_params = sum(os.path.getsize(p) for p in src.glob("model*.safetensors")) // 2
    cpu = task_table(Path(a.zest_report).read_text())
    cuda = task_table(Path(a.cuda_report).read_text()) if a.cuda_report else {}
    hf_acc = {}
    for t in EXAMPLE_TASKS + ["text"]:
        rows = [r for r in hf if r["task"] == t]
        hf_acc[t] = f"{100.0 * sum(r['correct'] for r in rows) / max(1, len(rows)):.1f}"
    rows = ["| task | items | transformers (f32) | zest CPU | zest CUDA |", "|---|---:|---:|---:|---:|"]
    for t in EXAMPLE_TASKS + ["text"]:
        n = sum(1 for it in items if it["task"] == t)
        rows.append(f"| {t} | {n} | {hf_acc[t]} | {cpu.get(t, '-')} | {cuda.get(t, '-')} |")
    tc, vc = cfg["text_config"], cfg["vision_config"]
    command_line = f"\nCommand (each chunk): `{a.train_command}`." if a.train_command else ""
    card = f"""# zest-demo-vl

A small Qwen3-VL-MoE (`qwen3_vl_moe`, the architecture of Qwen3-VL-30B-A3B and -235B-A22B) trained
from scratch by zest on procedurally drawn images, so that zest's default model answers and the
accuracy cost of VisionZip and SERE can be measured. It reads short documents, receipts, signs,
tables and charts whose text is set in zest's 16 x 32-pixel character cells, counts shapes in
photo-like scenes and compares several images. It is a demonstration model: it knows nothing beyond
these tasks and reads nothing but text laid out this way.

## Architecture

About {n_params / 1e6:.1f}M parameters, bf16. Vision tower: depth {vc['depth']}, width {vc['hidden_size']},
{vc['num_heads']} heads, patch 16, 2x2 merge, deepstack from block {vc['deepstack_visual_indexes']}.
Language model: {tc['num_hidden_layers']} layers, width {tc['hidden_size']}, {tc['num_attention_heads']} query and
{tc['num_key_value_heads']} key-value heads of {tc['head_dim']}, {tc['num_experts']} experts of width
{tc['moe_intermediate_size']} with top-{tc['num_experts_per_tok']} routing in every layer, interleaved M-RoPE
{tc['rope_parameters']['mrope_section']}, vocabulary {tc['vocab_size']} (a byte-level BPE trained on the task text,
with Qwen3-VL's special tokens and chat template). transformers and zest load it unchanged.

## Accuracy

Greedy exact match on the held-out split (`eval/`, seed 2; training used seed 1):

{chr(10).join(rows)}

{a.agreement}

## Training

`tools/demo_model/` (see its README): {len(log) and log[-1]['step']} steps of 256 samples drawn on the fly
(about {train_minutes(log):.0f} minutes of one H100{'' if chunks(log) == 1 else f' in {chunks(log)} resumed chunks'}), AdamW, lr 8e-4 with warmup
and cosine decay, fp32 master weights under bf16 autocast.{command_line}
Last teacher-forced probe: {json.dumps(probe[-1]['probe']) if probe else '-'}.

## Files

- the model: `config.json`, `model.safetensors`, `generation_config.json` (greedy),
  `preprocessor_config.json`, `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`;
- `examples/`: five held-out images with their questions and answers (the CI test and the
  quickstart ask zest about them);
- `eval/`: the held-out set's questions and answers (`eval.jsonl`) and the SHA-256 of every image;
  `python3 tools/demo_model/make_eval.py --out DIR` draws the images again (DejaVu fonts from
  `tools/demo_model/fetch_fonts.sh`).
{vz_line}
## Licence

Apache-2.0. The weights, tokenizer and data are zest's own, made from scratch; no third-party weights
or data went in. The training images were drawn with the DejaVu fonts (Bitstream Vera licence), which
are not redistributed here.
"""
    (out / "README.md").write_text(card)
    print(f"wrote {out}: {len(examples)} examples, {len(items)} eval items")


if __name__ == "__main__":
    main()
