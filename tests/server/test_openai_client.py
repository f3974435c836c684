#!/usr/bin/env python3
"""`zest serve` driven by the official `openai` Python client (loopback only).

Uses the virtual environment scripts/install-deps.sh makes (creating it and installing `openai` from PyPI when
missing; exits 77, a ctest skip, only when the package cannot be installed), starts `zest serve --port 0` on each
given model, and checks a plain completion, streaming (the streamed text equals the non-streamed
text of the same greedy request), stream_options.include_usage, logprobs (equal to the log-softmax of
`zest logits --all-positions` over prompt + completion, within LOGPROB_TOL; streamed the same), n = 3 (choice i is
the single request with seed + i), text completions (string, token-id and list prompts, legacy logprobs,
streaming, prompt_logprobs through extra_body), /tokenize and /detokenize, /v1/models, an image as a data URL (VL models), structured output
(response_format json_schema / json_object, tool_choice "required" and a named function as tool_calls), and OpenAI
errors (400, 404, best_of and an unsupported schema keyword refused by name) raised as the client's exception types.

    test_openai_client.py --zest BUILD/zest --model DIR [--model DIR ...] --venv BUILD/openai-venv
"""
import argparse
import base64
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


SKIP = 77  # ctest's SKIP_RETURN_CODE for this test


def ensure_venv(venv: pathlib.Path) -> None:
    """Re-executes this script inside `venv` (scripts/install-deps.sh makes it), creating it and installing openai
    when needed. Exits with SKIP only when the package cannot be installed (no route to PyPI)."""
    python = venv / "bin" / "python"
    if pathlib.Path(sys.prefix).resolve() == venv.resolve():
        return
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    has_openai = subprocess.run([str(python), "-c", "import openai"], capture_output=True).returncode == 0
    if not has_openai:
        pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "openai"],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            print("SKIP: the openai package cannot be installed:\n" + pip.stderr[-2000:])
            sys.exit(SKIP)
    os.execv(str(python), [str(python)] + sys.argv)


class ZestServer:
    """`zest serve --port 0` in a subprocess; the port is read from its start-up line on stderr."""

    def __init__(self, zest: str, model: str):
        self.proc = subprocess.Popen(
            [zest, "serve", "--model", model, "--port", "0", "--max-context", "1024", "--max-num-seqs", "8"],
            stderr=subprocess.PIPE, text=True)
        self.port = None
        self.log = []
        found = threading.Event()

        def read_stderr():
            for line in self.proc.stderr:
                self.log.append(line)
                if self.port is None and "on http://" in line:
                    self.port = int(line.split("on http://", 1)[1].split()[0].rsplit(":", 1)[1])
                    found.set()
            found.set()

        self.reader = threading.Thread(target=read_stderr, daemon=True)
        self.reader.start()
        if not found.wait(START_TIMEOUT_S) or self.port is None:
            self.proc.kill()
            raise RuntimeError("zest serve did not start:\n" + "".join(self.log))
        self.base = f"http://127.0.0.1:{self.port}"
        self.wait_healthy()

    def wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("zest serve never became healthy")

    def health(self):
        with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
            return json.loads(r.read())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise RuntimeError("zest serve did not stop on SIGTERM")


def post(srv, path: str, body: dict) -> dict:
    """A JSON POST to the server outside the OpenAI client (vLLM's /tokenize and /detokenize)."""
    req = urllib.request.Request(srv.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def load_npy_f32(path: pathlib.Path):
    """(shape, flat list of floats) of a little-endian float32 .npy file (no numpy needed)."""
    import ast
    import struct
    data = path.read_bytes()
    check(data[:6] == b"\x93NUMPY", "npy magic")
    major = data[6]
    hlen = struct.unpack("<H", data[8:10])[0] if major == 1 else struct.unpack("<I", data[8:12])[0]
    start = (10 if major == 1 else 12) + hlen
    header = ast.literal_eval(data[(10 if major == 1 else 12):start].decode("latin1"))
    check(header["descr"] == "<f4" and not header["fortran_order"], header)
    shape = header["shape"]
    count = 1
    for d in shape:
        count *= d
    return shape, struct.unpack(f"<{count}f", data[start:start + 4 * count])


LOGPROB_TOL = 1e-4  # the server's decode steps against one prefill of prompt + completion (f32, other sum orders)


def check_logprobs_against_zest_logits(client, name, zest, model_dir, messages, tmp: pathlib.Path) -> None:
    """Logprobs of a sampled completion equal the log-softmax of `zest logits --all-positions` at its positions."""
    import math
    body = dict(model=name, messages=messages, max_tokens=6, temperature=0.9, seed=11, logprobs=True, top_logprobs=3,
                extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    r = client.chat.completions.create(**body)
    content = r.choices[0].logprobs.content
    check(len(content) == 6 == r.usage.completion_tokens, (len(content), r.usage))
    ids = [int(c.token.split(":", 1)[1]) for c in content]
    # Streaming gives the same tokens and logprobs, spread over the chunks.
    streamed = []
    for ch in client.chat.completions.create(stream=True, **body):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            streamed += ch.choices[0].logprobs.content
    check([(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content],
          "streamed logprobs differ from the whole response's")
    req = tmp / "logprobs_request.json"
    req.write_text(json.dumps({"messages": messages}))
    out = tmp / "logprobs_logits.npy"
    run = subprocess.run([zest, "logits", "--model", model_dir, "--request", str(req), "--out", str(out),
                          "--all-positions", "--append-ids", json.dumps(ids)], capture_output=True, text=True)
    check(run.returncode == 0, run.stderr)
    all_ids = json.loads(run.stdout.strip().splitlines()[-1])
    n_prompt = len(all_ids) - len(ids)
    check(all_ids[n_prompt:] == ids, "appended ids")
    (rows, vocab), flat = load_npy_f32(out)
    check(rows == len(all_ids), (rows, len(all_ids)))
    for i, c in enumerate(content):
        row = flat[(n_prompt - 1 + i) * vocab:(n_prompt + i) * vocab]
        mx = max(row)
        lse = mx + math.log(sum(math.exp(x - mx) for x in row))
        want = row[ids[i]] - lse
        check(abs(c.logprob - want) <= LOGPROB_TOL, f"token {i}: logprob {c.logprob} != {want}")
        check(len(c.top_logprobs) == 3, c.top_logprobs)
        order = sorted(range(vocab), key=lambda t: -row[t])[:3]
        check([int(t.token.split(":", 1)[1]) for t in c.top_logprobs] == order, (c.top_logprobs, order))
        for t in c.top_logprobs:
            tid = int(t.token.split(":", 1)[1])
            check(abs(t.logprob - (row[tid] - lse)) <= LOGPROB_TOL, (t, row[tid] - lse))


def check_structured_output(client, name: str, messages: list) -> None:
    """Structured output on the random-weight fixture (the model knows no JSON: the grammar makes every structure).
    Thinking is off (the Qwen3 template would let the random model think without end); the schemas bound every
    string so replies end by EOS well within max_tokens. tool_choice "required" (one call) and a named function come
    back as tool_calls whose arguments follow the tool's parameters; response_format json_schema gives content that
    parses and validates, streamed the same; an unsupported schema keyword is a 400 naming it."""
    import openai

    no_think = {"chat_template_kwargs": {"enable_thinking": False}}
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                        "unit": {"enum": ["c", "f"]}},
                       "required": ["city"], "additionalProperties": False}}}
    ping = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for seed in (1, 2, 3):
            r = client.chat.completions.create(model=name, messages=messages, tools=[ping, weather],
                                               tool_choice=choice, parallel_tool_calls=False, max_tokens=200,
                                               temperature=1.0, seed=seed, extra_body=no_think)
            c = r.choices[0]
            check(c.finish_reason == "tool_calls" and c.message.content is None, c)
            check(len(c.message.tool_calls) == 1, c.message.tool_calls)
            call = c.message.tool_calls[0]
            check(call.type == "function" and call.id.startswith("call_"), call)
            args = json.loads(call.function.arguments)
            if call.function.name == "ping":
                check(choice == "required" and args == {}, call)
            else:
                check(call.function.name == "get_weather", call)
                check(set(args) <= {"city", "unit"} and isinstance(args["city"], str) and len(args["city"]) <= 8, args)
                check(args.get("unit", "c") in ("c", "f"), args)

    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 10}, "count": {"type": "integer"},
                             "ok": {"type": "boolean"}, "tags": {"type": "array", "maxItems": 2,
                                                                 "items": {"enum": ["a", "b"]}}},
              "required": ["name", "count", "ok"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    for seed in (4, 5, 6):
        r = client.chat.completions.create(model=name, messages=messages, response_format=fmt, max_tokens=300,
                                           temperature=1.0, seed=seed, extra_body=no_think)
        c = r.choices[0]
        check(c.finish_reason == "stop", c)
        obj = json.loads(c.message.content)
        check(list(obj)[:3] == ["name", "count", "ok"] and set(obj) <= {"name", "count", "ok", "tags"}, obj)
        check(isinstance(obj["name"], str) and len(obj["name"]) <= 10, obj)
        check(isinstance(obj["count"], int) and isinstance(obj["ok"], bool), obj)
        check(all(t in ("a", "b") for t in obj.get("tags", [])) and len(obj.get("tags", [])) <= 2, obj)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=name, messages=messages, response_format=fmt, max_tokens=300, temperature=1.0, seed=seed,
            stream=True, extra_body=no_think) if ch.choices)
        check(streamed == c.message.content, (streamed, c.message.content))
    r = client.chat.completions.create(model=name, messages=messages, response_format={"type": "json_object"},
                                       max_tokens=5, temperature=0, extra_body=no_think)
    check(r.choices[0].message.content.lstrip().startswith("{"), r.choices[0])
    try:
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}}}
        client.chat.completions.create(model=name, messages=messages, response_format=bad, max_tokens=4)
        raise AssertionError("a schema with 'pattern' was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and "'pattern'" in e.body.get("message", ""), e.body)


def run_checks(srv: ZestServer, model_dir: str, source_dir: pathlib.Path, zest: str, tmp: pathlib.Path) -> None:
    import openai

    client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0, timeout=120)
    models = client.models.list()
    names = [m.id for m in models.data]
    check(len(names) == 1, f"one model listed: {names}")
    name = names[0]
    messages = [{"role": "user", "content": "Name three colors."}]

    # Plain completion.
    plain = client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0)
    check(plain.object == "chat.completion", plain.object)
    check(plain.id.startswith("chatcmpl-"), plain.id)
    choice = plain.choices[0]
    check(choice.message.role == "assistant", choice.message.role)
    check(choice.finish_reason in ("stop", "length"), choice.finish_reason)
    u = plain.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8, u)
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, u)

    # Streaming: same greedy request, same text, finish reason on the last choice chunk.
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    check(len(chunks) >= 2, f"{len(chunks)} chunks")
    check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(text == choice.message.content, f"streamed {text!r} != plain {choice.message.content!r}")
    check(chunks[-1].choices[0].finish_reason == choice.finish_reason, chunks[-1])

    # include_usage with ignore_eos: exactly max_tokens tokens, usage in a final chunk without choices.
    chunks = list(client.chat.completions.create(model=name, messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    last = chunks[-1]
    check(last.choices == [] and last.usage is not None, last)
    check(last.usage.completion_tokens == 6, last.usage)
    check(last.usage.prompt_tokens == u.prompt_tokens, (last.usage, u))
    check(all(c.usage is None for c in chunks[:-1]), "usage only on the last chunk")
    check(chunks[-2].choices[0].finish_reason == "length", chunks[-2])

    # Logprobs: the model's own distribution, as `zest logits` computes it.
    check_logprobs_against_zest_logits(client, name, zest, model_dir, messages, tmp)
    plain_lp = client.chat.completions.create(model=name, messages=messages, max_tokens=3, temperature=0,
                                              logprobs=True, top_logprobs=2)
    lp0 = plain_lp.choices[0].logprobs.content[0]
    check(bytes(lp0.bytes).decode("utf-8", "replace") == lp0.token or "\ufffd" in lp0.token, lp0)
    check(plain_lp.choices[0].logprobs.content[0].top_logprobs[0].logprob >= lp0.logprob, lp0)

    # n = 3: three choices, choice i sampled from seed + i (the same text as a single request with that seed).
    many = client.chat.completions.create(model=name, messages=messages, max_tokens=5, temperature=1.0, seed=77, n=3,
                                          extra_body={"ignore_eos": True})
    check([c.index for c in many.choices] == [0, 1, 2], many.choices)
    for i in range(3):
        one = client.chat.completions.create(model=name, messages=messages, max_tokens=5, temperature=1.0,
                                             seed=77 + i, extra_body={"ignore_eos": True})
        check(many.choices[i].message.content == one.choices[0].message.content, (i, many.choices[i], one))
    check(len({c.message.content for c in many.choices}) == 3, "three seeds, three samples")
    check(many.usage.completion_tokens == 15 and many.usage.prompt_tokens == u.prompt_tokens, many.usage)

    # Text completions: a string, its token ids (from /tokenize) and a list of both give the same greedy text;
    # legacy logprobs; /detokenize inverts /tokenize.
    text = "The capital of France is"
    tok = post(srv, "/tokenize", {"prompt": text})
    ids = tok["tokens"]
    check(tok["count"] == len(ids) > 0, tok)
    check(post(srv, "/detokenize", {"tokens": ids})["prompt"] == text, "detokenize(tokenize(text)) == text")
    c1 = client.completions.create(model=name, prompt=text, max_tokens=5, temperature=0, logprobs=2,
                                   extra_body={"ignore_eos": True})
    check(c1.object == "text_completion" and len(c1.choices) == 1, c1)
    check(c1.usage.prompt_tokens == len(ids) and c1.usage.completion_tokens == 5, c1.usage)
    lp = c1.choices[0].logprobs
    check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5, lp)
    check(all(max(t.values()) >= v for t, v in zip(lp.top_logprobs, lp.token_logprobs)), lp)
    # prompt_logprobs (vLLM's extension, through extra_body): one entry per prompt token, null first, each holding
    # the prompt token's log-probability under its id.
    pl = client.completions.create(model=name, prompt=ids, max_tokens=1, temperature=0,
                                   extra_body={"prompt_logprobs": 1})
    entries = (pl.choices[0].model_extra or {}).get("prompt_logprobs")
    check(isinstance(entries, list) and len(entries) == len(ids) and entries[0] is None, entries)
    check(all(str(t) in e and e[str(t)]["logprob"] <= 0 for t, e in zip(ids[1:], entries[1:])), entries)
    c2 = client.completions.create(model=name, prompt=ids, max_tokens=5, temperature=0,
                                   extra_body={"ignore_eos": True})
    check(c2.choices[0].text == c1.choices[0].text, (c1.choices[0].text, c2.choices[0].text))
    c3 = client.completions.create(model=name, prompt=[text, "Hello"], max_tokens=5, temperature=0, n=2,
                                   extra_body={"ignore_eos": True})
    check([c.index for c in c3.choices] == [0, 1, 2, 3], c3.choices)
    check(c3.choices[0].text == c3.choices[1].text == c1.choices[0].text, c3.choices)
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=name, prompt=text, max_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True})
        if ch.choices)
    check(streamed == c1.choices[0].text, (streamed, c1.choices[0].text))

    # Tools: a round trip with a tool result in the history, given as the client sends it, is rendered as
    # transformers renders it (the prompt has the token count of the fixture's reference text); a forced malformed
    # call stays content.
    vl = (pathlib.Path(model_dir) / "preprocessor_config.json").exists()
    cases = json.loads((source_dir / "tests/text/data/chat_cases.json").read_text(encoding="utf-8"))["cases"]
    case = next(c for c in cases if c["name"] == ("qwen3vl/vl_openai_tool_round_trip" if vl else
                                                  "qwen3/openai_tool_round_trip"))
    rt = client.chat.completions.create(model=name, messages=case["messages"], tools=case["tools"], max_tokens=3,
                                        temperature=0)
    ref_ids = post(srv, "/tokenize", {"prompt": case["expected"]})["tokens"]
    check(rt.usage.prompt_tokens == len(ref_ids), (rt.usage, len(ref_ids)))
    check(rt.choices[0].finish_reason in ("stop", "length", "tool_calls"), rt.choices[0])
    bad = client.chat.completions.create(model=name, messages=messages, tools=case["tools"], max_tokens=3,
                                         temperature=0, extra_body={"logit_bias": {"151657": 100}, "ignore_eos": True})
    check(bad.choices[0].message.content == "<tool_call>" * 3 and not bad.choices[0].message.tool_calls, bad.choices[0])
    check_structured_output(client, name, messages)

    # Thinking: with the reasoning parser (on by default for the Qwen3 text template) a <think> block goes to
    # reasoning_content, streamed as its own deltas. Every token is forced to <think>.
    think = dict(model=name, messages=messages, max_tokens=4, temperature=0,
                 extra_body={"logit_bias": {"151667": 100}, "ignore_eos": True})
    r = client.chat.completions.create(**think)
    extra = r.choices[0].message.model_extra or {}
    if vl:
        check("reasoning_content" not in extra and r.choices[0].message.content == "<think>" * 4, r.choices[0])
    else:
        check(extra.get("reasoning_content") == "<think>" * 3 and r.choices[0].message.content is None, r.choices[0])
        reasoning = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                            for ch in client.chat.completions.create(stream=True, **think) if ch.choices)
        check(reasoning == "<think>" * 3, reasoning)

    # An image as a data URL (VL models only).
    if (pathlib.Path(model_dir) / "preprocessor_config.json").exists():
        png = (source_dir / "assets/images/chart_line_pew_pena_nieto.png").read_bytes()
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        r = client.chat.completions.create(
            model=name, max_tokens=4, temperature=0,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                   {"type": "text", "text": "Describe the chart."}]}],
            extra_body={"mm_processor_kwargs": {"min_pixels": 32 * 32, "max_pixels": 128 * 128}})
        extra = r.usage.model_extra or {}
        check(extra.get("visual_tokens_before", 0) > 0, r.usage)
        check(r.usage.prompt_tokens > u.prompt_tokens, (r.usage, u))

    # Errors arrive as the client's exception types with the OpenAI error body.
    try:
        client.chat.completions.create(model=name, messages=[], max_tokens=4)
        raise AssertionError("empty messages were accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400, e)
        check(isinstance(e.body, dict) and "messages" in e.body.get("message", ""), e.body)
    try:
        client.chat.completions.create(model=name, messages=messages, max_tokens=4, extra_body={"best_of": 2})
        raise AssertionError("best_of = 2 was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "best_of", e.body)
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.status_code == 404, e)

    h = srv.health()
    check(h["kv_blocks_used"] == 0, h)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zest", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--venv", required=True)
    args = ap.parse_args()
    ensure_venv(pathlib.Path(args.venv))
    source_dir = pathlib.Path(__file__).resolve().parents[2]
    tmp_dir = tempfile.TemporaryDirectory()
    for model in args.model:
        srv = ZestServer(args.zest, model)
        try:
            run_checks(srv, model, source_dir, args.zest, pathlib.Path(tmp_dir.name))
        finally:
            rc = srv.stop()
        check(rc == 0, f"zest serve exited with {rc}")
        print(f"ok: {pathlib.Path(model).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
