#!/usr/bin/env python3
"""The oracle for the DeepSeek, Kimi and GLM output parsers: each real chat template, rendered by Python jinja2
as transformers sets it up, writes an assistant turn carrying reasoning, content and tool calls; the part after
the generation prompt is the text the model would have produced. tests/serve/test_output_parser_oracle.cpp
feeds that text to xmoe's parser in random chunk splits and must recover the same reasoning, content, tool
names and arguments (arguments compared as JSON).

Run:     /work/venv/bin/python tools/make_output_parser_fixtures.py
Inputs:  tests/data/chat_templates/<name>.jinja (verbatim copies of the published templates).
Outputs: tests/data/serve/output_parser_oracle.json: per template the offered tools, and per case the generated
         text, whether the prompt left the model inside <think>, and the expected reasoning, content and calls.

How the generated text is cut out: P = render(history, add_generation_prompt=True), F = render(history +
[assistant], add_generation_prompt=False); F must start with P, and the generated text is F[len(P):] without
the end-of-turn token that ends generation (the engine stops on it and does not deliver its text). Templates
that drop an assistant turn's reasoning (DeepSeek-V3.1 always, others before the last user turn) are given the
reasoning where the model writes it: between the prompt's <think> and the </think> the template wrote. With
thinking off the turn carries no reasoning, and where the prompt closed an empty thinking block the template
writes differently in history (DeepSeek-V3.2: prompt "<think></think>", history "</think>") the text after that
close is the generated text.
Kimi-K2's templates call list.append, which transformers' ImmutableSandboxedEnvironment refuses (so transformers
cannot render their tool calls; the chat-template fixtures keep that error); for this oracle only, a template
that fails so is rendered in jinja2's mutable SandboxedEnvironment with the same settings, filters and globals.
"""
import copy
import json
import pathlib
import sys

import jinja2
import jinja2.sandbox
import transformers
from transformers.utils import chat_template_utils as ctu

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_template_fixtures import TOOLS, compile_template  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATE_DIR = ROOT / "tests" / "data" / "chat_templates"
OUT = ROOT / "tests" / "data" / "serve" / "output_parser_oracle.json"

# Template → the text of its end-of-turn token (generation stops on it).
TEMPLATES = {
    "deepseek-ai-DeepSeek-V3.1": "<｜end▁of▁sentence｜>",
    "deepseek-ai-DeepSeek-V3.2": "<｜end▁of▁sentence｜>",
    "moonshotai-Kimi-K2": "<|im_end|>",
    "Kimi-K2-Instruct": "<|im_end|>",
    "Kimi-K2-Thinking": "<|im_end|>",
    "GLM-4.6": "",
    "GLM-4.7-Flash": "",
}

FLAG_SETS = [
    ("think", {"thinking": True, "enable_thinking": True}),
    ("nothink", {"thinking": False, "enable_thinking": False}),
]


def call(name, args, as_string=False, call_id="call_1"):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


WEATHER = {"location": "Paris, France", "unit": "celsius", "days": 2}
SEARCH = {"query": "moe routing ü <b>&amp;</b> {\"x\": 1}", "tags": ["a", "b"], "limit": 2.5,
          "options": {"exact": False, "weight": 1.0}}
UNICODE_WEATHER = {"location": "東京 😀 \"quoted\" back\\slash", "days": 10}


def scenarios():
    """(name, history, assistant message)."""
    ask = [{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Weather in Paris?"}]
    yield "content_only", ask, {"role": "assistant", "content": "It is sunny, 21 °C.",
                                "reasoning_content": "The user asks about weather.\nAnswer directly."}
    yield "one_call", ask, {"role": "assistant", "content": "Let me check.",
                            "reasoning_content": "I should call get_weather.",
                            "tool_calls": [call("get_weather", WEATHER)]}
    yield "call_without_content", ask, {"role": "assistant", "content": "",
                                        "reasoning_content": "Tool time.",
                                        "tool_calls": [call("get_weather", UNICODE_WEATHER)]}
    yield "two_calls", ask, {"role": "assistant", "content": "Checking both.",
                             "reasoning_content": "Two tools: weather, then docs.",
                             "tool_calls": [call("get_weather", WEATHER),
                                            call("search_docs", SEARCH, call_id="call_2")]}
    yield "string_arguments", ask, {"role": "assistant", "content": "One moment.",
                                    "reasoning_content": "Arguments arrive as a JSON string.",
                                    "tool_calls": [call("get_weather", WEATHER, as_string=True)]}
    yield "empty_arguments", ask, {"role": "assistant", "content": "", "reasoning_content": "No filters.",
                                   "tool_calls": [call("search_docs", {})]}
    after_results = ask + [
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", WEATHER),
                                                            call("search_docs", SEARCH, call_id="call_2")]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "name": "search_docs", "content": "no results"},
    ]
    yield "after_tool_results", after_results, {"role": "assistant", "content": "21 °C; the docs say nothing.",
                                                "reasoning_content": "Both results are in."}
    yield "call_after_tool_results", after_results, {
        "role": "assistant", "content": "", "reasoning_content": "Retry the search.",
        "tool_calls": [call("search_docs", {"query": "again", "tags": []}, call_id="call_3")]}
    multi_turn = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Weather in Paris, and tell me about MoE."}]
    yield "unicode_multi_turn", multi_turn, {"role": "assistant", "content": "Ça va 👍 — «ok» <b>bold</b>",
                                             "reasoning_content": "Mixed scripts: 世界 😀.",
                                             "tool_calls": [call("get_weather", UNICODE_WEATHER)]}


def mutable_twin(template, source):
    env = template.environment
    twin = jinja2.sandbox.SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                               extensions=[jinja2.ext.loopcontrols])
    twin.filters.update(env.filters)
    twin.globals.update(env.globals)
    compiled = twin.from_string(source)
    compiled.globals.update(template.globals)
    return compiled


def render(template, messages, tools, flags, add_generation_prompt):
    chat = ctu._alias_reasoning_fields(ctu._plain_template_data(copy.deepcopy(messages)))
    context = {"messages": chat, "tools": copy.deepcopy(tools), "documents": None,
               "add_generation_prompt": add_generation_prompt, "bos_token": "<BOS>", "eos_token": "<EOS>"}
    context.update(flags)
    return template.render(**context)


def main():
    fixture = {"oracle": f"jinja2 {jinja2.__version__} via transformers {transformers.__version__} "
                         "chat_template_utils, each template's own rendering of an assistant turn",
               "tools": TOOLS, "templates": []}
    for name, end_token in TEMPLATES.items():
        source = (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")
        template = compile_template(source)
        cases, skipped = [], []
        for scenario, history, assistant in scenarios():
            for flag_name, flags in FLAG_SETS:
                case_name = f"{scenario}/{flag_name}"
                if not flags["thinking"]:
                    assistant = {k: v for k, v in assistant.items() if k != "reasoning_content"}
                try:
                    try:
                        prompt = render(template, history, TOOLS, flags, True)
                        full = render(template, history + [assistant], TOOLS, flags, False)
                    except jinja2.exceptions.SecurityError:
                        twin = mutable_twin(template, source)
                        prompt = render(twin, history, TOOLS, flags, True)
                        full = render(twin, history + [assistant], TOOLS, flags, False)
                except jinja2.exceptions.TemplateError as e:  # e.g. GLM refuses arguments given as a string
                    skipped.append(f"{case_name}: {e}")
                    continue
                closed = "<think></think>"
                if full.startswith(prompt):
                    generated = full[len(prompt):]
                elif prompt.endswith(closed) and full.startswith(prompt[:-len(closed)] + "</think>"):
                    generated = full[len(prompt) - len(closed) + len("</think>"):]
                else:
                    skipped.append(f"{case_name}: the turn does not continue the generation prompt")
                    continue
                if end_token:
                    generated = generated.rstrip()
                    assert generated.endswith(end_token), (name, case_name, generated)
                    generated = generated[:-len(end_token)]
                reasoning = assistant.get("reasoning_content", "")
                starts_in_thinking = prompt.rstrip().endswith("<think>")
                if reasoning and reasoning not in generated:
                    if starts_in_thinking and generated.startswith("</think>"):
                        generated = reasoning + generated
                    else:
                        reasoning = ""
                calls = [{"name": c["function"]["name"],
                          "arguments": (json.loads(c["function"]["arguments"])
                                        if isinstance(c["function"]["arguments"], str) else c["function"]["arguments"])}
                         for c in assistant.get("tool_calls", [])]
                cases.append({"name": case_name, "generated": generated, "starts_in_thinking": starts_in_thinking,
                              "reasoning": reasoning.strip(), "content": (assistant["content"] or "").strip(),
                              "tool_calls": calls})
        fixture["templates"].append({"template": f"{name}.jinja", "cases": cases, "skipped": skipped})
        print(f"{name}: {len(cases)} cases, {len(skipped)} skipped", file=sys.stderr)
        for s in skipped:
            print(f"  skipped {s}", file=sys.stderr)
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
