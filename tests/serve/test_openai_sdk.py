"""The OpenAI API of a real `xmoe serve` (tiny random Qwen3-MoE, see conftest.py) through the official `openai`
SDK. Oracles: the SDK's own parsing of every response and stream, Hugging Face transformers' tokenizer and chat
template for the prompt token counts, the engine's logprobs for completion counts, and greedy determinism."""
import json

import openai
import pytest
from transformers import AutoTokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
HELLO = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf_tokenizer(server):
    return AutoTokenizer.from_pretrained(server.model_dir)


def hf_prompt_tokens(tok, messages, **kwargs):
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]


def test_chat_non_streamed_usage_and_logprobs(client, server, hf_tokenizer):
    r = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=3)
    assert r.object == "chat.completion"
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens == hf_prompt_tokens(hf_tokenizer, HELLO)
    # One logprob entry per generated token: the completion count is the engine's real count.
    assert 1 <= r.usage.completion_tokens <= 12
    assert len(choice.logprobs.content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in choice.logprobs.content)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_equals_non_streamed(client, server):
    kwargs = dict(model=server.model, messages=HELLO, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    content, reasoning, finish, usage, roles = "", "", None, None, 0
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
            continue
        delta = chunk.choices[0].delta
        roles += delta.role == "assistant"
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles == 1
    assert content == (whole.choices[0].message.content or "")
    assert reasoning == (getattr(whole.choices[0].message, "reasoning_content", None) or "")
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_several_choices_and_seeds(client, server):
    r = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=6, n=3, temperature=1.0,
                                       seed=11)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    again = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=6, n=3, temperature=1.0,
                                           seed=11)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


def test_stop_sequence_on_completions(client, server):
    kwargs = dict(model=server.model, prompt="The experts", max_tokens=24, temperature=0)
    full = client.completions.create(**kwargs).choices[0].text
    printable = [i for i in range(2, len(full) - 2) if full[i:i + 2].isprintable() and full[i:i + 2].strip()]
    if not printable:
        pytest.skip(f"greedy text has no printable pair to stop on: {full!r}")
    stop = full[printable[0]:printable[0] + 2]
    r = client.completions.create(stop=[stop], **kwargs)
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=24, temperature=0,
                                          stop=stop)
    assert stop not in (chat.choices[0].message.content or "")


def test_forced_tool_call_round_trip(client, server, hf_tokenizer):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER, TIME], max_tokens=60,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].id.startswith("call_")
    assert calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    # The result goes back; the server renders the call and the result into the next prompt.
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp_c": 21}'}]
    follow = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER, TIME],
                                            max_tokens=8)
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # As transformers renders the same conversation (arguments as an object, as OpenAI-compatible servers pass them).
    hf_messages = [dict(m) for m in messages]
    hf_messages[1]["content"] = hf_messages[1].get("content") or ""
    hf_messages[1]["tool_calls"] = [{"type": "function", "id": calls[0].id, "function": {
        "name": "get_weather", "arguments": json.loads(calls[0].function.arguments)}}]
    assert follow.usage.prompt_tokens == hf_prompt_tokens(hf_tokenizer, hf_messages, tools=[WEATHER, TIME])


def test_required_tool_call_streamed(client, server):
    stream = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Time or weather?"}], tools=[WEATHER, TIME],
        tool_choice="required", max_tokens=60, stream=True)
    name, args, ids, finish = None, "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                ids.append(tc.id)
                name = tc.function.name
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert len(ids) == 1
    assert name in ("get_weather", "get_time")
    assert isinstance(json.loads(args), dict)
    assert finish == "tool_calls"


def test_json_object_response(client, server):
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "JSON please"}],
                                       response_format={"type": "json_object"}, max_tokens=40)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_thinking_switch_changes_the_prompt(client, server, hf_tokenizer):
    on = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=1,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    off = client.chat.completions.create(model=server.model, messages=HELLO, max_tokens=1, reasoning_effort="none")
    assert on.usage.prompt_tokens == hf_prompt_tokens(hf_tokenizer, HELLO, enable_thinking=True)
    assert off.usage.prompt_tokens == hf_prompt_tokens(hf_tokenizer, HELLO, enable_thinking=False)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens


def test_errors_as_the_sdk_raises_them(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert e.value.status_code == 400
    assert "messages[0].content[0]" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server.model, messages=HELLO, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=server.model, messages=HELLO, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    bad_key = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model=server.model, messages=HELLO, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.get("/no/such/route", cast_to=object)
