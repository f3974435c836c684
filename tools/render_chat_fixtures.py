#!/opt/refenv/bin/python
"""Renders reference chat prompts with the Qwen3 and Qwen3-VL Jinja templates for zest's tests.

Uses transformers' own renderer (render_jinja_template: a sandboxed jinja2 environment with
trim_blocks, lstrip_blocks and transformers' tojson = json.dumps(ensure_ascii=False)), exactly what
tokenizer.apply_chat_template does. Writes tests/text/data/chat_cases.json: for each case the kind,
messages, tools, options and the rendered string.

Two input conventions of zest (also vLLM's) are applied before rendering and recorded as-is in the
fixture: a null `content` renders as "", and for the text-only Qwen3 template a list of text parts is
joined with "\\n".

Run from the repository root:  /opt/refenv/bin/python tools/render_chat_fixtures.py
"""
import copy
import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = {
    "qwen3": os.path.join(ROOT, "assets/tokenizer/chat_template.qwen3.jinja"),
    "qwen3vl": os.path.join(ROOT, "assets/tokenizer/chat_template.qwen3-vl-instruct.jinja"),
}
OUT = os.path.join(ROOT, "tests/text/data/chat_cases.json")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. Uses \"quotes\" & <tags>, ünïcödé.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "number"}}},
    },
}
IMG = {"type": "image", "image": "file:///data/cat.jpg"}
IMG_URL = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
IMG_NOTYPE = {"image": "https://example.com/b.jpg"}
VIDEO = {"type": "video", "video": "file:///data/clip.mp4"}
VIDEO_NOTYPE = {"video": ["f1.jpg", "f2.jpg"]}


def text(t):
    return {"type": "text", "text": t}


def call(name, args, wrap=True):
    inner = {"name": name, "arguments": args}
    return {"id": "call_" + name, "type": "function", "function": inner} if wrap else inner


def qwen3_cases():
    c = []
    c.append(("single_user", [{"role": "user", "content": "Hello! Who are you?"}], None, {}))
    c.append(("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "Give me a short introduction to LLMs."}], None, {}))
    c.append(("thinking_off", [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "2+2?"}], None, {"enable_thinking": False}))
    c.append(("no_generation_prompt", [{"role": "user", "content": "hi"}], None, {"add_generation_prompt": False}))
    c.append(("multi_turn_think_in_content", [
        {"role": "user", "content": "What is 3*7?"},
        {"role": "assistant", "content": "<think>\nMultiply.\n3*7=21.\n</think>\n\n21"},
        {"role": "user", "content": "And 4*8?"}], None, {}))
    c.append(("final_assistant_with_reasoning_field", [
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7", "reasoning_content": "\nSmall primes: 2, 3, 5, 7.\n\n"}],
        None, {"add_generation_prompt": False}))
    c.append(("final_assistant_think_in_content_no_reasoning", [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "\n\nHi there!"}], None, {"add_generation_prompt": False}))
    c.append(("assistant_before_last_query_keeps_plain", [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "hidden r1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>r2</think>A2"}], None, {"add_generation_prompt": False}))
    c.append(("tools_with_system", [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL, SEARCH_TOOL], {}))
    c.append(("tools_without_system", [{"role": "user", "content": "Search for cats"}], [SEARCH_TOOL], {}))
    c.append(("tool_call_flow", [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather in Paris and Tokyo, in celsius?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should call the tool twice.",
         "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}),
                        call("get_weather", '{"city": "Tokyo"}')]},
        {"role": "tool", "content": "{\"temp\": 18.5}"},
        {"role": "tool", "content": "{\"temp\": 22}"},
        {"role": "assistant", "content": "Paris is 18.5°C and Tokyo 22°C.", "reasoning_content": "Both done."}],
        [WEATHER_TOOL], {"add_generation_prompt": False}))
    c.append(("tool_call_flow_pending", [
        {"role": "user", "content": "Look up zest"},
        {"role": "assistant", "content": "Let me search.",
         "tool_calls": [call("search", {"query": "zest \"engine\"\n\ttabs \\ back", "top_k": 2.5,
                                        "weights": [1e-07, 0.5, 1e+20, -3.0, 123456789012345678],
                                        "flags": {"b": True, "a": None, "z": "🦙 ü"}}, wrap=False)]},
        {"role": "tool", "content": "<result>zest is fast</result>"}], [SEARCH_TOOL], {}))
    c.append(("user_tool_response_text_counts_as_tool", [
        {"role": "user", "content": "Do it"},
        {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "x"})]},
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"},
        {"role": "assistant", "content": "<think>\ndone\n</think>\n\nFinished."}], None, {"add_generation_prompt": False}))
    c.append(("system_not_first", [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hey"},
        {"role": "system", "content": "Switch to French."},
        {"role": "user", "content": "bonjour"}], None, {}))
    c.append(("list_text_parts", [
        {"role": "system", "content": [text("Part one."), text("Part two.")]},
        {"role": "user", "content": [text("Line A"), text("Line B")]}], None, {}))
    c.append(("unicode_and_whitespace", [
        {"role": "user", "content": "  空白  \n\n東京 🦙 emoji\t<tab>  "},
        {"role": "assistant", "content": "\n\n<think>\n\n\nthinking…\n\n</think>\n\n\nanswer\n"},
        {"role": "user", "content": ""}], None, {"enable_thinking": False}))
    c.append(("multiple_think_tags", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "pre<think>a</think>mid<think>b</think>\npost"}],
        None, {"add_generation_prompt": False}))
    c.append(("openai_tool_round_trip", openai_round_trip(), [WEATHER_TOOL, SEARCH_TOOL], {}))
    c.append(("openai_tool_round_trip_thinking_off", openai_round_trip(), [WEATHER_TOOL], {"enable_thinking": False}))
    return c


def openai_round_trip():
    """A tool round trip as the openai client sends it: arguments as JSON strings, ids, tool_call_id and name."""
    return [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris and in Lyon?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 18}"},
        {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "{\"temp\": 21}"},
    ]


def qwen3vl_cases():
    c = []
    c.append(("vl_one_image", [{"role": "user", "content": [IMG, text("Describe this image.")]}], None, {}))
    c.append(("vl_two_images_vision_id", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [IMG, IMG_URL, text("Compare them.")]}], None, {"add_vision_id": True}))
    c.append(("vl_images_in_earlier_turns", [
        {"role": "user", "content": [text("First: "), IMG]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [IMG_NOTYPE, text("And this one?")]},
        {"role": "assistant", "content": [text("A dog.")]},
        {"role": "user", "content": "Which is cuter?"}], None, {"add_vision_id": True}))
    c.append(("vl_video_and_image", [
        {"role": "user", "content": [VIDEO, text("What happens?"), IMG, VIDEO_NOTYPE]}], None, {"add_vision_id": True}))
    c.append(("vl_video_no_vision_id", [{"role": "user", "content": [VIDEO, text("Summarize.")]}], None, {}))
    c.append(("vl_system_parts", [
        {"role": "system", "content": [text("Sys A. "), IMG, text("Sys B.")]},
        {"role": "user", "content": "hi"}], None, {}))
    c.append(("vl_tools_system_parts", [
        {"role": "system", "content": [text("Use tools wisely.")]},
        {"role": "user", "content": [IMG, text("Where is this? Check weather.")]}], [WEATHER_TOOL], {}))
    c.append(("vl_tools_no_system", [{"role": "user", "content": "hi"}], [SEARCH_TOOL, WEATHER_TOOL], {}))
    c.append(("vl_tool_flow", [
        {"role": "user", "content": [IMG, text("Weather where this photo was taken?")]},
        {"role": "assistant", "content": None,
         "tool_calls": [call("get_weather", {"city": "Kyoto", "days": 2}), call("search", "{\"query\":\"kyoto\"}")]},
        {"role": "tool", "content": [text("Sunny, 25C. Map: "), IMG_URL]},
        {"role": "tool", "content": "results..."},
        {"role": "assistant", "content": [text("It is sunny in Kyoto.")],
         "tool_calls": [call("search", {"query": "more"}, wrap=False)]},
        {"role": "tool", "content": "done"}], [WEATHER_TOOL, SEARCH_TOOL], {"add_vision_id": True}))
    c.append(("vl_system_not_first_is_dropped", [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "ignored by this template"},
        {"role": "user", "content": [text("b")]}], None, {}))
    c.append(("vl_no_generation_prompt", [
        {"role": "user", "content": [IMG, text("Caption?")]},
        {"role": "assistant", "content": "<think>not special here</think> A photo."}], None,
        {"add_generation_prompt": False}))
    c.append(("vl_openai_tool_round_trip", openai_round_trip(), [SEARCH_TOOL, WEATHER_TOOL], {}))
    c.append(("vl_text_only", [{"role": "user", "content": "Plain text question with ünïcödé 🦙"}], None, {}))
    c.append(("vl_unknown_part_and_empty", [
        {"role": "user", "content": [{"type": "audio", "audio": "x.wav"}, text(""), text("after")]},
        {"role": "assistant", "content": ""}], None, {}))
    return c


def prepare(kind, messages):
    """Applies zest's input conventions (see module doc) to a copy of the messages."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("content") is None:
            m["content"] = ""
        if kind == "qwen3" and isinstance(m["content"], list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
    return out


def main():
    templates = {k: open(v, encoding="utf-8").read() for k, v in TEMPLATES.items()}
    cases = []
    all_cases = [("qwen3", c) for c in qwen3_cases()] + [("qwen3vl", c) for c in qwen3vl_cases()]
    # The text-only conversations also run through the VL template.
    all_cases += [("qwen3vl", c) for c in qwen3_cases()[:3]]
    for kind, (name, messages, tools, opts) in all_cases:
        options = {"add_generation_prompt": True, "enable_thinking": True, "add_vision_id": False}
        options.update(opts)
        rendered, _ = render_jinja_template(
            conversations=[prepare(kind, messages)], tools=tools, chat_template=templates[kind],
            add_generation_prompt=options["add_generation_prompt"], enable_thinking=options["enable_thinking"],
            add_vision_id=options["add_vision_id"])
        cases.append({"name": kind + "/" + name, "kind": kind, "messages": messages, "tools": tools,
                      "options": options, "expected": rendered[0]})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"source": "transformers render_jinja_template on assets/tokenizer/chat_template.*.jinja",
                   "cases": cases}, f, ensure_ascii=False, indent=1)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
