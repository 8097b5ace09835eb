"""DeepSeek-V3.1/V3.2, Kimi-K2 (×3) and GLM-4.6/4.7 conversations for tools/make_template_fixtures.py (cases
"<conversation>/<flags>" in tests/data/chat_templates/<template>.json). The generic conversations cover every
template; these add what these templates branch on: an agent loop (reasoning, content and several tool calls,
several tool results in a row, a final answer, another call), the turn after the last user message (where
DeepSeek-V3.2, Kimi-K2-Thinking and GLM keep reasoning), arguments as a string, two system messages, an assistant
prefix (DeepSeek), <think> inside content without reasoning_content (DeepSeek and GLM split it), a tool result
without a preceding call, each under `thinking` / `enable_thinking` / `clear_thinking` and with and without the
generation prompt.
"""

import json

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "days": {"type": "integer"},
        "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}}}},
        "required": ["location"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search « the web ».",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "number"}}}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def call(name, args, call_id, as_string=False):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def conversations():
    weather = call("get_weather", {"location": "Paris", "days": 2, "options": {"hourly": True}}, "c1")
    search = call("search", {"q": "MoE ü", "n": 3.5}, "c2")
    yield "agent_loop", [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Plan my trip to Paris."},
        {"role": "assistant", "content": "Checking weather and news.", "reasoning_content": "Need two tools.",
         "tool_calls": [weather, search]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"sky": "clear"}'},
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": "3 hits"},
        {"role": "assistant", "content": "Clear skies; 3 news items.", "reasoning_content": "Summarise."},
        {"role": "user", "content": "Search again."},
        {"role": "assistant", "content": "", "reasoning_content": "One more search.",
         "tool_calls": [call("search", {"q": "again"}, "c3")]},
        {"role": "tool", "tool_call_id": "c3", "name": "search", "content": "0 hits"},
    ], TOOLS
    yield "three_results_in_a_row", [
        {"role": "user", "content": "Three lookups please."},
        {"role": "assistant", "content": None, "tool_calls": [weather, search, call("search", {"q": "x"}, "c4")]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": "a"},
        {"role": "tool", "tool_call_id": "c4", "name": "search", "content": "b"},
    ], TOOLS
    yield "answer_after_last_user", [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "Call the tool.",
         "tool_calls": [weather]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "rain"},
        {"role": "assistant", "content": "\nIt rains.\n", "reasoning_content": "\n  Rain, so say so.  \n"},
    ], TOOLS
    yield "string_arguments", [
        {"role": "user", "content": "Weather and search."},
        {"role": "assistant", "content": "Both.", "tool_calls": [
            call("get_weather", {"location": "Oslo"}, "c1", as_string=True),
            call("search", {"q": "fjords"}, "c2", as_string=True)]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "cold"},
    ], TOOLS
    yield "two_system_messages", [
        {"role": "system", "content": "First rule."},
        {"role": "system", "content": "Second rule."},
        {"role": "user", "content": "Hello"},
    ], None
    yield "assistant_prefix", [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Autumn", "prefix": True},
    ], None
    yield "think_tags_in_content", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>again</think>6"},
    ], None
    yield "tool_result_without_call", [
        {"role": "user", "content": "Here is a result."},
        {"role": "tool", "tool_call_id": "x", "name": "search", "content": "orphan"},
    ], TOOLS


# `enable_thinking` true with the generation prompt renders as `thinking` true does (DeepSeek falls back to it,
# GLM treats it as its default), so it is left out; the last set reaches DeepSeek's `thinking` through it.
flag_sets = [
    ("thinking", {"add_generation_prompt": True, "thinking": True}),
    ("thinking_off", {"add_generation_prompt": True, "thinking": False, "enable_thinking": False}),
    ("no_gen_keep_thinking", {"add_generation_prompt": False, "enable_thinking": True, "clear_thinking": False}),
]

TEMPLATES = ["deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2", "moonshotai-Kimi-K2", "Kimi-K2-Instruct",
             "Kimi-K2-Thinking", "GLM-4.6", "GLM-4.7-Flash"]
