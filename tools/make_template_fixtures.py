#!/usr/bin/env python3
"""Renders the real chat templates with Python jinja2, set up exactly as transformers sets it up, to make the
fixtures that tests/llm/test_chat_template.cpp compares xmoe's in-house Jinja engine with byte for byte.

Run with the oracle virtualenv:  /work/oracle-venv/bin/python tools/make_template_fixtures.py
Inputs:  the templates in ../shared/data/chat-templates/ (from llama.cpp's models/templates, MIT, which copies them
         from each model's Hugging Face hub repository).
Outputs: tests/data/chat_templates/<name>.jinja (a verbatim copy) and <name>.json holding, for every conversation,
         the exact template context (messages after transformers' reasoning-field aliasing, tools, flags, tokens) and
         either the expected text or the expected error (type and message).
"""
import copy
import datetime
import json
import os
import pathlib
import shutil
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The shared folder next to the checkout (/work/main -> /work/shared); XMOE_SHARED_DIR overrides it (worktrees).
SOURCE_DIR = pathlib.Path(os.environ.get("XMOE_SHARED_DIR", ROOT.parent / "shared")) / "data" / "chat-templates"
OUT_DIR = ROOT / "tests" / "data" / "chat_templates"

# strftime_now is monkeypatched to this instant so the expected text does not depend on the day it was made;
# the C++ test passes the same broken-down time.
FIXED_NOW = datetime.datetime(2026, 3, 7, 9, 5, 4)

TEMPLATES = [
    "Qwen-Qwen3-0.6B",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "openai-gpt-oss-120b",
    "deepseek-ai-DeepSeek-V3.1",
    "deepseek-ai-DeepSeek-V3.2",
    "moonshotai-Kimi-K2",
    "Kimi-K2-Instruct",
    "Kimi-K2-Thinking",
    "GLM-4.6",
    "GLM-4.7-Flash",
    "MiniMax-M2",
    "meta-llama-Llama-3.1-8B-Instruct",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city.\n",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                    "days": {"type": "integer", "description": "Forecast days", "default": 3, "minimum": 1},
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation « all of it ».",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for"},
                    "tags": {"type": "array", "items": {"type": "string"}, "description": "Filter tags"},
                    "limit": {"type": "number", "nullable": True},
                    "options": {
                        "type": "object",
                        "properties": {"exact": {"type": "boolean"}, "weight": {"type": "number", "default": 0.5}},
                    },
                },
                "required": ["query", "tags"],
            },
        },
    },
]

UNICODE_TEXT = 'héllo 世界 😀 "double" \'single\' back\\slash\ttab <b>&amp;</b>'


def weather_call(arguments_as_string):
    args = {"location": "Paris, France", "unit": "celsius", "days": 2}
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(args) if arguments_as_string else args},
    }


def search_call():
    args = {"query": "moe routing ü", "tags": ["a", "b"], "limit": 2.5, "options": {"exact": False, "weight": 1.0}}
    return {"id": "call_2", "type": "function", "function": {"name": "search_docs", "arguments": args}}


def conversations():
    """(name, messages, tools) triples covering what the templates branch on."""
    yield "single_user", [{"role": "user", "content": "Hi there"}], None
    yield "system_multi_turn", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ], None
    yield "tools_dict_arguments", [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [weather_call(False)]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 21 °C and clear."},
        {"role": "user", "content": "Thanks!"},
    ], TOOLS
    yield "tools_string_arguments", [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [weather_call(True)]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21 C"},
    ], TOOLS
    yield "tools_pending_result", [
        {"role": "user", "content": "Search the docs for moe routing"},
        {"role": "assistant", "content": "", "tool_calls": [search_call()]},
        {"role": "tool", "tool_call_id": "call_2", "name": "search_docs", "content": "3 results"},
    ], TOOLS
    yield "two_tool_calls", [
        {"role": "user", "content": "Weather and docs please"},
        {"role": "assistant", "content": None, "tool_calls": [weather_call(False), search_call()]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search_docs", "content": "nothing found"},
    ], TOOLS
    yield "reasoning_content", [
        {"role": "user", "content": "Think first: 17*3?"},
        {"role": "assistant", "content": "51", "reasoning_content": "17*3 = 51.\nDone."},
        {"role": "user", "content": "Now 17*4?"},
        {"role": "assistant", "content": "68", "reasoning_content": "17*4 = 68."},
    ], None
    yield "inline_think_tags", [
        {"role": "system", "content": "Reason step by step."},
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors 2..sqrt(7).\n</think>\n\nYes, 7 is prime."},
        {"role": "user", "content": "And 9?"},
    ], None
    yield "unicode", [
        {"role": "system", "content": "Réponds en français. ✓"},
        {"role": "user", "content": UNICODE_TEXT},
        {"role": "assistant", "content": "Ça va 👍 — «ok»\n"},
        {"role": "user", "content": "  padded with spaces \n"},
    ], None
    yield "content_parts", [
        {"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]},
    ], None
    yield "empty_messages", [], None
    yield "multimodal_parts", [
        {"role": "system", "content": "Describe images."},
        {"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "video", "video": "v.mp4"}, {"type": "text", "text": "And this?"}]},
    ], None
    yield "tool_content_list", [
        {"role": "user", "content": "Run both"},
        {"role": "assistant", "content": "", "tool_calls": [weather_call(False)]},
        {"role": "tool", "name": "get_weather", "content": [{"output": "r1"}, {"type": "text", "text": "t2"}]},
    ], TOOLS
    yield "developer_thinking_named", [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "name": "alice", "content": "Hello?"},
        {"role": "assistant", "thinking": "Greet back.", "content": "Hi alice."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "<think>short</think>Bye!", "prefix": True},
    ], TOOLS


# Small templates that exercise one construct each, for the semantics the real templates touch only lightly
# (whitespace control, Python printing, scoping, filters, tests). Each is (name, template, context).
CONSTRUCTS = [
    ("ws_trim_lstrip", "a  \n  {% if true %}\n  x\n  {% endif %}\n b", {}),
    ("ws_dash_both", "A \n {%- if true -%} \n x \n {%- endif -%} \n B", {}),
    ("ws_var_no_lstrip", "  {{ 'v' }}  \n  {{- 'w' -}}  \n.", {}),
    ("ws_plus_markers", "  {%+ if true %}x{% endif +%}\ny\n  {% if true %}z{% endif %}", {}),
    ("ws_comments", "  {# c #}\nA  {#- c -#}  B\n{# c #}C\n  {#- d #}\nD", {}),
    ("ws_set_line", "line\n   {%- set x = 1 %}\n  y{{ x }}\n    {% set z = 2 %}\nq{{ z }}", {}),
    ("ws_trailing_one_newline", "x\n", {}),
    ("ws_trailing_two_newlines", "x\n\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("ws_block_after_text", "text {% if true %}\nyes{% endif %}\n  tail", {}),
    ("raw_block", "  {% raw %}{{ not }} {% if %}{% endraw %}\nafter", {}),
    ("print_python_repr", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}, (1,), (1, 'b')] }}|{{ {'a': [1, 2]} }}", {}),
    ("print_string_repr", "{{ ['a\"b', \"a'b\", 'a\\'b\"c', 'é\\u00a0\\u3000x', '\\x01\\t\\\\'] }}", {}),
    ("print_numbers", "{{ 1/3 }} {{ 10/2 }} {{ 2**0.5 }} {{ 1e100 }} {{ 1.0e-5 }} {{ 0.0001 }} {{ 123456789012345678.0 }} "
     "{{ 1e16 }} {{ 1e15 }} {{ -0.0 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2**10 }} {{ 3 * 'ab' }}", {}),
    ("print_context_numbers", "{{ i }} {{ f }} {{ g }} {{ big }} {{ t }} {{ n }} {{ f + i }} {{ i * 2 }}",
     {"i": 3, "f": 2.5, "g": 1.0, "big": 12345678901234, "t": True, "n": None}),
    ("tojson_variants", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(ensure_ascii=True) }}\n"
     "{{ d | tojson(sort_keys=true) }}\n{{ d | tojson(separators=(',', ':')) }}\n{{ [] | tojson(indent=2) }}"
     "{{ {} | tojson }}{{ 'x\\ty\\u0001\"' | tojson }}{{ none | tojson }}",
     {"d": {"z": [1, 2.5, {"q": None}], "a": "é😀\n", "m": {}, "e": [], "b": True}}),
    ("slices", "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3,4,5][::2] }} {{ [1,2,3][-2:] }} {{ 'héllo'[1] }} "
     "{{ [1,2,3][5:] }} {{ [1,2,3,4][-1:0:-1] }} {{ 'abc'[:-1] }} {{ [1,2,3][:n] }}", {"n": 2}),
    ("string_methods", "{{ 'a,b,,c'.split(',') }} {{ '  a b  '.split() }} {{ 'a b c'.split(' ', 1) }} "
     "{{ 'xxhixx'.strip('x') }} {{ '\\u3000 hi \\n'.strip() }}|{{ '--a--'.lstrip('-') }} {{ '--a--'.rstrip('-') }} "
     "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'aaa'.replace('a', 'b', 2) }} "
     "{{ 'MiXed'.upper() }} {{ 'MiXed'.lower() }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }}", {}),
    ("loop_variables", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('p', 'q') }};"
     "{% endfor %}", {}),
    ("for_else_filter_unpack", "{% for x in [] %}no{% else %}empty{% endfor %}|"
     "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}@{{ loop.index }}/{{ loop.length }} {% endfor %}|"
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d | items %}{{ k }}{% endfor %}|"
     "{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": [2]}}),
    ("loop_controls", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}"
     "{{ x }}{% endfor %}|{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}", {}),
    ("scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}|{{ x }}|"
     "{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% set ns = namespace(t=0) %}"
     "{% for i in [1, 2, 3] %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }}", {}),
    ("macros", "{% macro greet(name, punct='!', times=1) -%}\n  {{ (name ~ punct) * times }}\n{%- endmacro %}"
     "{{ greet('a') }}|{{ greet('b', '?') }}|{{ greet('c', times=2) }}|{{ greet() }}|"
     "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}|"
     "{% macro outer() %}{{ later }}{% endmacro %}{% set later = 'L' %}{{ outer() }}|{{ greet('d') | length }}", {}),
    ("tests", "{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}"
     "{{ s is iterable }}{{ y is iterable }}{{ i is iterable }}{{ d is sequence }}{{ y is sequence }}{{ t is number }}"
     "{{ t is boolean }}{{ i is integer }}{{ f is float }}{{ t is true }}{{ false is false }}{{ i is equalto 3 }}"
     "{{ i is eq(3) }}{{ 'a' is in ['a'] }}{{ i is odd }}{{ i is even }}{{ i is divisibleby 3 }}{{ s is lower }}"
     "{{ n is not none }}{{ i is gt 2 }}{{ i is ne 3 }}",
     {"x": 1, "n": None, "s": "str", "d": {"a": 1}, "i": 3, "f": 0.5, "t": True}),
    ("filters", "{{ u | default('dflt') }} {{ '' | default('e', true) }} {{ l | join(', ') }} "
     "{{ people | map(attribute='name') | join('/') }} {{ people | selectattr('age', 'gt', 30) | map(attribute='name') | list }} "
     "{{ l | reject('equalto', 2) | list }} {{ l | select('odd') | list }} {{ l | first }} {{ l | last }} {{ 'héllo' | length }} "
     "{{ '42' | int + 1 }} {{ '2.5' | float }} {{ 'x' | int }} {{ '  pad  ' | trim }}|{{ 'xxpadxx' | trim('x') }} "
     "{{ 'aXbX' | replace('X', '-') }} {{ 'hello WORLD' | capitalize }} {{ '<a&b>' | escape }} {{ -3 | abs }} "
     "{{ people | join(', ', attribute='name') }} {{ d | items | list }} {{ 5 | string + '!' }} {{ [3, 'a'] | string }}",
     {"l": [1, 2, 3], "people": [{"name": "ann", "age": 31}, {"name": "bob", "age": 25}], "d": {"k": "v"}}),
    ("operators", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' not in 'abc' }} {{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} "
     "{{ 1 ~ none ~ true ~ 2.0 }} {{ [1] + [2] }} {{ 'y' if false }}|{{ 'y' if true else 'n' }} {{ not 0 }} "
     "{{ -2 ** 2 }} {{ (1, 2) == (1, 2) }} {{ [1, 2] == (1, 2) }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'b' > 'a' }} "
     "{{ [1, 2] < [1, 3] }} {{ 2 * 3 + 4 / 2 - 1 }} {{ 10 - 2 - 3 }} {{ 2 ** 3 ** 2 }} {{ -n | abs }}", {"n": 5}),
    ("dict_access", "{{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d.get('zz') }} {{ d.keys() | list }} "
     "{{ d['items'] }} {{ d.a }} {{ d['a'] }} {{ d.missing }}|{{ l[0] }} {{ l[-1] }} {{ l.0 }} {{ d.values() | list }}",
     {"d": {"a": 1, "items": "key-not-method", "b": [2]}, "l": ["x", "y"]}),
    ("literals_and_escapes", "{{ 'a' 'b' }} {{ '\\x41\\u00e9\\U0001F600\\101\\q' }} {{ \"tab\\there\" }} {{ 1_000 }} "
     "{{ 0.5e1 }} {{ [1, 2,] }} {{ {'k': 1, 'j': [none]} }} {{ True }} {{ False }} {{ None }}", {}),
    ("block_set_and_generation", "{% set s %}  in {{ 1 }}  {% endset %}[{{ s }}]{% generation %}gen {{ s | trim }}"
     "{% endgeneration %}", {}),
    ("strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S|%A %a %B %b %d %j %p %y') }}", {}),
    ("unicode_content", "{{ s | length }} {{ s[::-1] }} {{ s.upper() }} {{ s | tojson }} {{ s | tojson(ensure_ascii=true) }}",
     {"s": "añ世😀"}),
    ("namespace_features", "{% set ns = namespace(a=1, items=[1, 2]) %}{{ ns.a }} {{ ns.items | length }} {{ ns.missing }}|"
     "{% set ns.a = ns.a ~ 'x' %}{{ ns.a }} {% set d = dict(x=1, y='2') %}{{ d }} {{ d.x }}", {}),
    ("scoping_loop_iterations", "{% for i in [1, 2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}|"
     "{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}{% endfor %}{{ x }}", {}),
    ("scoping_macros", "{% macro m() %}{% set y = 5 %}{{ y }}{% endmacro %}{{ m() }}[{{ y }}]|{% set x = 1 %}"
     "{% macro n() %}{{ x }}{% set x = 2 %}{{ x }}{% endmacro %}{{ n() }}{{ x }}|"
     "{% for a in [1] %}{% for b in [2, 3] %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}", {}),
    # A loop reuses its iteration's frame and loop object unless the body keeps them (xmoe's interpreter).
    ("loop_iteration_scope_reused", "{% for x in 'abc' %}[{{ y }}]{% set y = loop.index %}{% set x = 'z' %}{{ x }}{{ y }}"
     "{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% set a = 0 %}{{ a }};{% endfor %}", {}),
    ("loop_object_kept_by_the_body", "{% set ns = namespace(seen=[]) %}{% for x in 'ab' %}{% set l = loop %}"
     "{% set ns.seen = ns.seen + [l.index, loop.first] %}{% for y in [1, 2] %}{{ loop.index }}{{ l.index }}{% endfor %};"
     "{% endfor %}{{ ns.seen }}", {}),
    ("loop_macro_defined_in_body", "{% for x in [1, 2, 3] %}{% macro m(p) %}<{{ x }}{{ p }}>{% endmacro %}{{ m(loop.index) }}"
     "{% endfor %}|{% for x in [1, 2] %}{% for y in 'ab' %}{% macro n() %}{{ x }}{{ y }}{{ loop.index }}{% endmacro %}"
     "{{ n() }}{% endfor %}{% endfor %}", {}),
    ("evaluation_order", "{% set ns = namespace(c=0) %}{% macro bump() %}{% set ns.c = ns.c + 1 %}{{ ns.c }}"
     "{% endmacro %}{{ bump() ~ bump() }} {{ bump() + bump() }} {{ [bump(), bump()] }} {{ {'k': bump()}[bump()] }}", {}),
    ("markup_semantics", "{{ ['a' | safe, 'b' | escape] }} {{ ('<' | safe) + '<' }} {{ '<' + ('b' | safe) }} "
     "{{ ('<' | safe) ~ '<' }} {% macro m() %}<{% endmacro %}{{ [m()] }} {% set blk %}x{% endset %}{{ [blk] }}", {}),
    ("python_string_predicates", "{{ 0 is lower }} {{ 'a1' is lower }} {{ 'A1' is upper }} {{ 'Ab' is upper }} "
     "{{ 2.5 is even }} {{ 4.0 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 7.5 is divisibleby 2.5 }}", {}),
    ("python_float_divmod", "{{ 2.5 // 0.1 }} {{ 2.5 % 0.1 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 7.5 % -2 }} "
     "{{ -2 ** f }} {{ -2 ** 2 }} {{ (1,) * 2 }} {{ (1,) + (2,) }}", {"f": 0.5}),
    ("error_undefined_attribute", "{{ a.b }}", {}),
    ("error_raise_exception", "{% if true %}\n{{ raise_exception('custom message') }}\n{% endif %}", {}),
    ("error_unsafe_pop", "{{ [1].pop() }}", {}),
    ("error_type_concat", "{{ 'a' + 1 }}", {}),
    ("error_in_none", "{{ 'x' in none }}", {}),
    ("error_items_on_list", "{{ [1] | items | list }}", {}),
]


# Each conversation is rendered under these flag sets (absent keys are simply not passed, as transformers does).
FLAG_SETS = [
    ("gen", {"add_generation_prompt": True}),
    ("gen_think_off", {"add_generation_prompt": True, "enable_thinking": False}),
    ("nogen_think_on", {"add_generation_prompt": False, "enable_thinking": True}),
]
# Template-specific keyword arguments (gpt-oss, Llama 3.1, Qwen3.5, GLM-4.7, DeepSeek), for the conversations
# where they change the output.
EXTRA_FLAGS = (
    "extras",
    {
        "add_generation_prompt": True,
        "enable_thinking": True,
        "thinking": True,
        "builtin_tools": ["browser", "python"],
        "reasoning_effort": "high",
        "model_identity": "You are a test model.",
        "tools_in_user_message": False,
        "date_string": "01 Jan 2026",
        "add_vision_id": True,
        "clear_thinking": False,
    },
)
EXTRA_FLAG_CONVERSATIONS = {"tools_dict_arguments", "reasoning_content", "multimodal_parts", "developer_thinking_named"}


def template_conversations():
    """Conversations one template branches on beyond the generic ones: {template: module with conversations()
    and flag_sets} (gpt-oss's harmony: tools/harmony_template_cases.py; DeepSeek, Kimi, GLM:
    tools/family_template_cases.py)."""
    import family_template_cases
    import harmony_template_cases
    cases = {name: family_template_cases for name in family_template_cases.TEMPLATES}
    cases["openai-gpt-oss-120b"] = harmony_template_cases
    return cases


def compile_template(source):
    template = ctu._compile_jinja_template(source)
    # Same environment, only strftime_now pinned (the global is looked up at render time).
    template.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(fmt)
    return template


def context_for(messages, tools, flags, template_name):
    # What transformers' render_jinja_template hands to the template: plain data, reasoning fields aliased,
    # tools/documents always present (None when absent), special tokens from the tokenizer as kwargs.
    chat = ctu._alias_reasoning_fields(ctu._plain_template_data(copy.deepcopy(messages)))
    context = {"messages": chat, "tools": copy.deepcopy(tools), "documents": None}
    context.update(flags)
    context["bos_token"] = "<BOS>" if "llama" not in template_name else "<|begin_of_text|>"
    context["eos_token"] = "<EOS>"
    return context


def main():
    global TEMPLATE_CONVERSATIONS
    TEMPLATE_CONVERSATIONS = template_conversations()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATES:
        source_path = SOURCE_DIR / f"{name}.jinja"
        shutil.copyfile(source_path, OUT_DIR / f"{name}.jinja")
        template = compile_template(source_path.read_text(encoding="utf-8"))
        cases = []
        extra = TEMPLATE_CONVERSATIONS.get(name)
        runs = [(c, m, t, FLAG_SETS + ([EXTRA_FLAGS] if c in EXTRA_FLAG_CONVERSATIONS else []))
                for c, m, t in conversations()]
        runs += [(c, m, t, extra.flag_sets) for c, m, t in extra.conversations()] if extra else []
        for conv_name, messages, tools, flag_sets in runs:
            for flag_name, flags in flag_sets:
                context = context_for(messages, tools, flags, name)
                case = {"name": f"{conv_name}/{flag_name}", "context": context}
                try:
                    case["expected"] = template.render(**copy.deepcopy(context))
                except jinja2.exceptions.TemplateError as e:
                    # raise_exception raises TemplateError itself; sandbox violations are SecurityError.
                    case["error"] = {"type": type(e).__name__, "message": str(e)}
                except Exception as e:  # Python TypeError / IndexError etc. raised while evaluating the template
                    case["error"] = {"type": type(e).__name__, "message": str(e)}
                cases.append(case)
        fixture = {
            "template": f"{name}.jinja",
            "provenance": "Hugging Face hub chat template as collected in llama.cpp models/templates (MIT)",
            "oracle": f"jinja2 {jinja2.__version__} via transformers {transformers.__version__} "
            "chat_template_utils (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols)",
            "strftime_now": FIXED_NOW.isoformat(),
            "cases": cases,
        }
        out = OUT_DIR / f"{name}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        errors = sum("error" in c for c in cases)
        print(f"{out.name}: {len(cases)} cases, {errors} raise", file=sys.stderr)

    cases = []
    for name, source, context in CONSTRUCTS:
        case = {"name": name, "template": source, "context": context}
        try:
            case["expected"] = compile_template(source).render(**copy.deepcopy(context))
        except Exception as e:
            case["error"] = {"type": type(e).__name__, "message": str(e)}
        cases.append(case)
    out = OUT_DIR / "constructs.json"
    out.write_text(json.dumps({"oracle": "jinja2 " + jinja2.__version__ + " via transformers chat_template_utils",
                               "strftime_now": FIXED_NOW.isoformat(), "cases": cases},
                              ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{out.name}: {len(cases)} cases, {sum('error' in c for c in cases)} raise", file=sys.stderr)


if __name__ == "__main__":
    main()
