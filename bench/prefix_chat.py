#!/usr/bin/env python3
"""Multi-turn chat with images against a running `zest serve`: the time to first token of each turn, and how much
of each turn's prompt came from the prefix cache. Turn 1 sends the images and a question; every later turn re-sends
the whole history (images included, as chat clients do) and a new question, so with automatic prefix caching it
skips the images' encoding and the prefill of everything before its new question.

Each repeat is its own conversation (its first text part differs), so turn 1 never finds an earlier repeat's blocks.
Greedy; `--out FILE` writes every reply, so that two servers (prefix caching on and off) can be checked to answer
the same. Standard library only.

    python3 bench/prefix_chat.py --url http://127.0.0.1:8000 --image a.png --image b.png --image c.png \
        [--turns 2] [--repeat 5] [--max-tokens 16] [--out replies.json] [--label caching]
"""
import argparse
import base64
import json
import mimetypes
import pathlib
import statistics
import time
import urllib.request

QUESTIONS = ["Describe the first image.", "What do the images have in common?", "Which image is the brightest?",
             "Name one thing in the last image."]


def data_url(path: str) -> str:
    mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64," + base64.b64encode(pathlib.Path(path).read_bytes()).decode()


def stream_chat(url: str, body: dict) -> tuple[float, str, dict]:
    """POSTs a streaming chat request; returns (ms to the first content chunk, the reply text, the usage)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            j = json.loads(payload)
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                piece = c["delta"].get("content") or c["delta"].get("reasoning_content") or ""
                if ttft is None and (piece or c.get("finish_reason")):
                    ttft = (time.perf_counter() - t0) * 1000.0
                text += c["delta"].get("content") or ""
    return ttft if ttft is not None else float("nan"), text, usage


def server_ttft_sum(url: str) -> float:
    """The server's zest_time_to_first_token_seconds_sum (from request received to the engine's first token)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("zest_time_to_first_token_seconds_sum"):
                return float(line.split()[-1])
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--image", action="append", required=True, help="an image of turn 1 (repeatable)")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", help="write every reply here (JSON)")
    ap.add_argument("--label", default="", help="the first column of the table row")
    ap.add_argument("--tag", default="", help="added to each conversation's first text (runs that must not share blocks)")
    a = ap.parse_args()
    images = [{"type": "image_url", "image_url": {"url": data_url(p)}} for p in a.image]
    ttft = [[] for _ in range(a.turns)]
    server = [[] for _ in range(a.turns)]  # the server's own TTFT (received -> first token), ms
    cached = [[] for _ in range(a.turns)]
    prompt = [[] for _ in range(a.turns)]
    replies = []
    for r in range(a.repeat):
        messages = [{"role": "user", "content": [{"type": "text", "text": f"Conversation {r}{a.tag}."}] + images +
                     [{"type": "text", "text": QUESTIONS[0]}]}]
        convo = []
        for t in range(a.turns):
            if t > 0:
                messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            before = server_ttft_sum(a.url)
            ms, text, usage = stream_chat(a.url, {"messages": messages, "max_tokens": a.max_tokens, "temperature": 0})
            ttft[t].append(ms)
            server[t].append((server_ttft_sum(a.url) - before) * 1000.0)
            prompt[t].append(usage.get("prompt_tokens", 0))
            cached[t].append((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
            convo.append(text)
            messages.append({"role": "assistant", "content": text})
        replies.append(convo)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(replies, ensure_ascii=False, indent=1))
    print("| setup | turn | TTFT median ms | TTFT min ms | server TTFT median ms | prompt tokens | cached tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t in range(a.turns):
        print(f"| {a.label} | {t + 1} | {statistics.median(ttft[t]):.1f} | {min(ttft[t]):.1f} | "
              f"{statistics.median(server[t]):.1f} | {statistics.median(prompt[t]):.0f} | "
              f"{statistics.median(cached[t]):.0f} |")


if __name__ == "__main__":
    main()
