"""The Anthropic Messages API of a real `xmoe serve` (tiny random Qwen3-MoE, see conftest.py) through the official
`anthropic` SDK. Oracles: the SDK's parsing of every message and event stream (its stream accumulator rebuilds the
message from the events), Hugging Face transformers' tokenizer and chat template for input token counts, and
greedy determinism."""
import anthropic
import pytest
from transformers import AutoTokenizer

WEATHER = {"name": "get_weather", "description": "Get the weather for a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
SYSTEM = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=server.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def hf_tokenizer(server):
    return AutoTokenizer.from_pretrained(server.model_dir)


def hf_prompt_tokens(tok, messages, **kwargs):
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_message_and_count_tokens(client, server, hf_tokenizer):
    m = client.messages.create(model="claude-sonnet-4-5", max_tokens=12, system=SYSTEM, messages=HELLO,
                               extra_body={"temperature": 0}, metadata={"user_id": "u1"})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == "claude-sonnet-4-5"
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert 1 <= m.usage.output_tokens <= 12
    # Anthropic's thinking is opt-in: without "thinking" the template renders thinking off.
    expected = hf_prompt_tokens(hf_tokenizer, [{"role": "system", "content": "You are terse."}] + HELLO,
                                enable_thinking=False)
    assert m.usage.input_tokens == expected
    counted = client.messages.count_tokens(model="claude-sonnet-4-5", system=SYSTEM, messages=HELLO)
    assert counted.input_tokens == expected


def test_stream_rebuilds_the_same_message(client, server):
    kwargs = dict(model=server.model, max_tokens=20, messages=HELLO, extra_body={"temperature": 0})
    whole = client.messages.create(**kwargs)
    events = []
    with client.messages.stream(**kwargs) as stream:
        for event in stream:
            events.append(event.type)
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "message_delta" in events
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stop_sequences(client, server):
    kwargs = dict(model=server.model, max_tokens=24, messages=HELLO, extra_body={"temperature": 0})
    text = "".join(b.text for b in client.messages.create(**kwargs).content if b.type == "text")
    pairs = [text[i:i + 2] for i in range(2, len(text) - 2) if text[i:i + 2].isprintable() and text[i:i + 2].strip()]
    if not pairs:
        pytest.skip(f"greedy text has no printable pair to stop on: {text!r}")
    m = client.messages.create(stop_sequences=[pairs[0]], **kwargs)
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == pairs[0]


def test_forced_tool_use_round_trip(client, server):
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    m = client.messages.create(model=server.model, max_tokens=60, tools=[WEATHER, TIME], messages=messages,
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    assert isinstance(uses[0].input, dict)
    messages += [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                               "content": [{"type": "text", "text": "21 C, clear"}]}]}]
    follow = client.messages.create(model=server.model, max_tokens=8, tools=[WEATHER, TIME], messages=messages)
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow.usage.input_tokens > m.usage.input_tokens


def test_any_tool_streamed(client, server):
    with client.messages.stream(model=server.model, max_tokens=60, tools=[WEATHER, TIME],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Time or weather?"}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "content_block_start" in kinds
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name in ("get_weather", "get_time")
    assert isinstance(uses[0].input, dict)  # the SDK parsed the input_json_delta fragments
    assert final.stop_reason == "tool_use"


def test_thinking_blocks(client, server, hf_tokenizer):
    m = client.messages.create(model=server.model, max_tokens=16, messages=HELLO,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.usage.input_tokens == hf_prompt_tokens(hf_tokenizer, HELLO, enable_thinking=True)
    for block in m.content:
        if block.type == "thinking":
            assert block.signature
    # A conversation that hands a thinking block (with its signature) back is accepted.
    history = HELLO + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Greet briefly.", "signature": "sig"}, {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Again."}]
    again = client.messages.create(model=server.model, max_tokens=4, messages=history,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    assert again.usage.output_tokens >= 1
    with client.messages.stream(model=server.model, max_tokens=16, messages=HELLO,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        events = list(stream)
    # Every thinking block closes with exactly one signature_delta just before its content_block_stop. The SDK's
    # stream also yields events it derives from the wire ("text", "thinking", "signature", "input_json", ...,
    # e.g. a "signature" right after each signature_delta): only the wire's events count here.
    wire = [e for e in events if e.type in {"message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"}]
    open_thinking = {}
    for i, e in enumerate(wire):
        if e.type == "content_block_start" and e.content_block.type == "thinking":
            open_thinking[e.index] = 0
        if e.type == "content_block_delta" and e.delta.type == "signature_delta":
            open_thinking[e.index] += 1
            assert wire[i + 1].type == "content_block_stop"
    assert all(n == 1 for n in open_thinking.values())


def test_errors_as_the_sdk_raises_them(client, server):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=server.model, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=server.model, max_tokens=4, messages=HELLO, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "nope"})
    bad_key = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(model=server.model, max_tokens=2, messages=HELLO)
    with pytest.raises(anthropic.NotFoundError):
        client.get("/v1/no-such-route", cast_to=object)
