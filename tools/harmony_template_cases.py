"""gpt-oss's harmony conversations for tools/make_template_fixtures.py (cases "<conversation>/<flags>" in
tests/data/chat_templates/openai-gpt-oss-120b.json). The generic conversations cover every template; these add
what harmony branches on: each reasoning_effort, an assistant turn with reasoning (`thinking`) then its final
answer, reasoning before a tool call (kept) and before the final answer of an earlier turn (dropped), tool calls
with dict and string arguments and their results (functions.NAME to=assistant), typed tool parameters (enums,
optional fields, arrays, nested objects), a developer message, builtin tools and model_identity.
"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Gets the current weather",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "array", "items": {"type": "integer"}},
        "options": {"type": "object", "properties": {"hourly": {"type": "boolean"}}}},
        "required": ["location"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The current time",
                                          "parameters": {"type": "object", "properties": {}}}}


def conversations():
    yield "reasoning_then_answer", [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "What is 17*23?"},
        {"role": "assistant", "thinking": "17*23 = 17*20 + 17*3 = 340 + 51 = 391.", "content": "391"},
        {"role": "user", "content": "And 391/17?"},
    ], None
    yield "tool_round_trip", [
        {"role": "developer", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "thinking": "Need the weather tool first.", "content": "",
         "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"location": "Paris, France", "unit": "celsius", "days": [1, 2]}}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "thinking": "Now the time.", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "name": "now", "content": "09:05"},
    ], [WEATHER, CLOCK]
    yield "tool_then_final", [
        {"role": "user", "content": "Is it warm in Oslo?"},
        {"role": "assistant", "thinking": "Call the tool.", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"location": "Oslo"}}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": -3}"},
        {"role": "assistant", "thinking": "-3 is cold.", "content": "No, it is -3 °C."},
        {"role": "user", "content": "Thanks! ✓"},
    ], [WEATHER]


flag_sets = [(f"effort_{e}", {"add_generation_prompt": True, "reasoning_effort": e}) for e in ("low", "medium", "high")]
flag_sets += [("no_gen", {"add_generation_prompt": False}),
          ("builtin_identity", {"add_generation_prompt": True, "builtin_tools": ["python"],
                                "model_identity": "You are a test model.", "reasoning_effort": "low"})]
