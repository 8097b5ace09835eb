#!/usr/bin/env python3
"""Renders OpenAI chat requests the way an OpenAI-compatible server built on transformers renders them (vLLM's
conventions: developer is system, text parts joined, tool-call arguments parsed into objects, tools as
{"type": "function", "function": …}, chat_template_kwargs and enable_thinking in the context), with Python jinja2
set up exactly as transformers sets it up. tests/serve/test_chat_prompt.cpp compares xmoe's parse of the same
request plus render_chat_prompt with these texts byte for byte.

Run:     /work/venv/bin/python tools/make_serve_fixtures.py
Inputs:  tests/data/chat_templates/{Qwen-Qwen3-0.6B,Qwen3-Coder}.jinja (copies of the published templates).
Output:  tests/data/serve/chat_prompts.json: [{"name", "template", "request", "expected"}].
"""
import copy
import json
import pathlib

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "tests" / "data" / "chat_templates"
OUT = ROOT / "tests" / "data" / "serve" / "chat_prompts.json"
TEMPLATES = ["Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja"]
BOS, EOS = "", "<|im_end|>"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather.\n",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City"},
        "days": {"type": "integer", "minimum": 1}}, "required": ["location"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}}}


def call(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


REQUESTS = [
    ("plain", {"messages": [{"role": "user", "content": "Hi there"}]}),
    ("system_multi_turn", {"messages": [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]}),
    ("developer_parts_unicode", {"messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Réponds "}, {"type": "text", "text": "✓"}]},
        {"role": "user", "content": [{"type": "text", "text": "héllo 世界 😀 \"q\"\n"}]}]}),
    ("thinking_off_kwargs", {"messages": [{"role": "user", "content": "x"}],
                             "chat_template_kwargs": {"enable_thinking": False}}),
    ("thinking_off_effort", {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none"}),
    ("reasoning_history", {"messages": [
        {"role": "user", "content": "17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51."},
        {"role": "user", "content": "17*4?"}]}),
    ("tools_offered", {"messages": [{"role": "system", "content": "Use tools."},
                                    {"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, SEARCH]}),
    ("tool_round_trip", {"messages": [
        {"role": "user", "content": "Weather in Paris and docs?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            call(1, "get_weather", {"location": "Paris", "days": 2}),
            call(2, "search", {"query": "moe", "tags": ["a", "b"]})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "3 results"}],
        "tools": [WEATHER, SEARCH]}),
    ("tool_choice_none", {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
                          "tool_choice": "none"}),
]


def to_context(request):
    """The template context an OpenAI-compatible transformers-based server builds for the request."""
    messages = []
    names = {}
    for m in request["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p["text"] for p in content)
        role = "system" if m["role"] == "developer" else m["role"]
        out = {"role": role, "content": content or ""}
        if role == "assistant":
            if m.get("reasoning_content"):
                out["reasoning_content"] = m["reasoning_content"]
            if m.get("tool_calls"):
                out["tool_calls"] = [{"type": "function", "id": c["id"], "function": {
                    "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                    for c in m["tool_calls"]]
                for c in m["tool_calls"]:
                    names[c["id"]] = c["function"]["name"]
        if role == "tool":
            out["tool_call_id"] = m["tool_call_id"]
            name = m.get("name") or names.get(m["tool_call_id"])
            if name:
                out["name"] = name
        messages.append(out)
    context = dict(request.get("chat_template_kwargs", {}))
    context["messages"] = messages
    tools = request.get("tools")
    context["tools"] = copy.deepcopy(tools) if tools and request.get("tool_choice") != "none" else None
    context["add_generation_prompt"] = True
    if request.get("reasoning_effort") == "none":
        context["enable_thinking"] = False
    context["bos_token"] = BOS
    context["eos_token"] = EOS
    return context


def main():
    cases = []
    for template_name in TEMPLATES:
        template = ctu._compile_jinja_template((TEMPLATE_DIR / template_name).read_text(encoding="utf-8"))
        for name, request in REQUESTS:
            expected = template.render(**copy.deepcopy(to_context(request)))
            cases.append({"name": name, "template": template_name, "request": request, "expected": expected})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "oracle": f"jinja2 {jinja2.__version__} via transformers {transformers.__version__} chat_template_utils",
        "bos_token": BOS, "eos_token": EOS, "cases": cases}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
