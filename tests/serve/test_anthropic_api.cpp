// The Anthropic adapter against a scripted backend: message bodies, the exact event sequence of streams (as
// formats-and-apis.md "HTTP APIs" gives Anthropic's), thinking, tool use, stop reasons, count_tokens, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "scripted_backend.hpp"

namespace xmoe::serve {
namespace {

using nlohmann::json;
using testing::run_stream;
using testing::Script;
using testing::ScriptedBackend;

struct Event {
  std::string name;
  json data;
};

std::vector<Event> sse_events(const std::string& body) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
    Event e{ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7))};
    EXPECT_EQ(e.data["type"], e.name);
    out.push_back(std::move(e));
  }
  return out;
}

std::string prompt_text(const ScriptedBackend& b) {
  return b.tokenizer_.decode(b.last.prompt);
}

int64_t count_tokens(const ScriptedBackend& b, const std::vector<std::string>& pieces) {
  int64_t n = 0;
  for (const std::string& p : pieces) n += static_cast<int64_t>(b.tokenizer_.encode(p).size());
  return n;
}

const char* kBasic = R"({"model": "claude-x", "max_tokens": 64,
  "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
  "messages": [{"role": "user", "content": "Hi"}], "metadata": {"user_id": "u"}, "service_tier": "auto",
  "some_future_field": [1, 2]})";

TEST(AnthropicMessages, NonStreamedThinkingAndText) {
  ScriptedBackend b;
  b.scripts = {Script({"<think>\nponder\n</think>\n\n", "Hello", "!"})};
  const std::string body =
      R"({"model": "claude-x", "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 1024},
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})";
  const ApiResponse r = anthropic_messages(body, b);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["model"], "claude-x");
  EXPECT_EQ(j["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(j["content"].size(), 2u);
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "ponder");
  EXPECT_FALSE(j["content"][0]["signature"].get<std::string>().empty());
  EXPECT_EQ(j["content"][1], json({{"type", "text"}, {"text", "Hello!"}}));
  EXPECT_EQ(j["stop_reason"], "end_turn");
  EXPECT_TRUE(j["stop_sequence"].is_null());
  EXPECT_EQ(j["usage"]["input_tokens"], b.last.prompt.size());
  EXPECT_EQ(j["usage"]["output_tokens"], count_tokens(b, b.scripts[0].pieces));
  EXPECT_EQ(b.last.max_tokens, 64);
  // thinking enabled: the template is not told to skip thinking.
  EXPECT_FALSE(prompt_text(b).ends_with("<think>\n\n</think>\n\n"));
  // budget_tokens: a processor forces </think> once the budget is spent.
  ASSERT_TRUE(static_cast<bool>(b.last.logits_processor));
  const int32_t close = *b.tokenizer_.token_to_id("</think>");
  std::vector<float> logits(b.tokenizer_.vocab_size(), 0.f);
  const std::vector<int32_t> spent(1024, 42);
  b.last.logits_processor(logits, spent);
  EXPECT_EQ(std::count_if(logits.begin(), logits.end(), [](float l) { return std::isfinite(l); }), 1);
  EXPECT_TRUE(std::isfinite(logits[close]));
  anthropic_messages(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})", b);
  EXPECT_FALSE(static_cast<bool>(b.last.logits_processor));
}

TEST(AnthropicMessages, StreamEventSequence) {
  ScriptedBackend b;
  b.scripts = {Script({"<think>\nhm", "m\n</think>", "\n\nHel", "lo"})};
  const std::string body =
      R"({"model": "claude-x", "max_tokens": 64, "stream": true, "thinking": {"type": "enabled", "budget_tokens": 2000},
    "messages": [{"role": "user", "content": "Hi"}]})";
  const ApiResponse r = anthropic_messages(body, b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  const std::vector<Event> ev = sse_events(run_stream(r));
  std::vector<std::string> names;
  for (const Event& e : ev) {
    std::string n = e.name;
    if (n == "content_block_delta") n += ":" + e.data["delta"]["type"].get<std::string>();
    if (n == "content_block_start") n += ":" + e.data["content_block"]["type"].get<std::string>();
    if (names.empty() || names.back() != n) names.push_back(n);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "message_start", "ping", "content_block_start:thinking", "content_block_delta:thinking_delta",
                "content_block_delta:signature_delta", "content_block_stop", "content_block_start:text",
                "content_block_delta:text_delta", "content_block_stop", "message_delta", "message_stop"}));
  const json& start = ev[0].data["message"];
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["content"], json::array());
  EXPECT_TRUE(start["stop_reason"].is_null());
  EXPECT_EQ(start["usage"]["input_tokens"], b.last.prompt.size());
  std::string thinking, text;
  int signatures = 0;
  for (const Event& e : ev) {
    if (e.name == "content_block_start") {
      EXPECT_EQ(e.data["index"], e.data["content_block"]["type"] == "thinking" ? 0 : 1);
      if (e.data["content_block"]["type"] == "thinking")
        EXPECT_EQ(e.data["content_block"], json({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}));
      else
        EXPECT_EQ(e.data["content_block"], json({{"type", "text"}, {"text", ""}}));
    }
    if (e.name != "content_block_delta") continue;
    const json& d = e.data["delta"];
    if (d["type"] == "thinking_delta") {
      thinking += d["thinking"].get<std::string>();
      EXPECT_EQ(e.data["index"], 0);
    } else if (d["type"] == "signature_delta") {
      ++signatures;
      EXPECT_FALSE(d["signature"].get<std::string>().empty());
    } else if (d["type"] == "text_delta") {
      text += d["text"].get<std::string>();
      EXPECT_EQ(e.data["index"], 1);
    }
  }
  EXPECT_EQ(thinking, "hmm");
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(signatures, 1);
  const json& md = ev[ev.size() - 2].data;
  EXPECT_EQ(md["delta"]["stop_reason"], "end_turn");
  EXPECT_TRUE(md["delta"]["stop_sequence"].is_null());
  EXPECT_EQ(md["usage"]["output_tokens"], count_tokens(b, b.scripts[0].pieces));
}

const char* kToolBody = R"({"model": "c", "max_tokens": 100, "stream": STREAM,
  "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object",
     "properties": {"city": {"type": "string"}}}}, {"type": "web_search_20250305", "name": "web_search"}],
  "messages": [{"role": "user", "content": "Weather?"}]})";

std::string tool_body(bool stream) {
  std::string s = kToolBody;
  s.replace(s.find("STREAM"), 6, stream ? "true" : "false");
  return s;
}

TEST(AnthropicMessages, ToolUseNonStreamed) {
  ScriptedBackend b;
  b.scripts = {
      Script({"Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
              "\"Oslo\"}}\n</tool_call>"})};
  const json j = json::parse(anthropic_messages(tool_body(false), b).body);
  ASSERT_EQ(j["content"].size(), 2u) << j;
  EXPECT_EQ(j["content"][0], json({{"type", "text"}, {"text", "Checking."}}));
  EXPECT_EQ(j["content"][1]["type"], "tool_use");
  EXPECT_EQ(j["content"][1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(j["content"][1]["name"], "get_weather");
  EXPECT_EQ(j["content"][1]["input"], json({{"city", "Oslo"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  // Server tools are not offered to the model; custom ones are.
  EXPECT_NE(prompt_text(b).find("get_weather"), std::string::npos);
  EXPECT_EQ(prompt_text(b).find("web_search"), std::string::npos);
}

TEST(AnthropicMessages, ToolUseStreamed) {
  ScriptedBackend b;
  b.scripts = {Script({"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", "ty\": \"Os",
                       "lo\"}}\n</tool_call>"})};
  const std::vector<Event> ev = sse_events(run_stream(anthropic_messages(tool_body(true), b)));
  std::string partial;
  int starts = 0;
  for (const Event& e : ev) {
    if (e.name == "content_block_start") {
      ++starts;
      EXPECT_EQ(e.data["index"], 0);
      EXPECT_EQ(e.data["content_block"]["type"], "tool_use");
      EXPECT_EQ(e.data["content_block"]["name"], "get_weather");
      EXPECT_EQ(e.data["content_block"]["input"], json::object());
    }
    if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["delta"]["type"], "input_json_delta");
      partial += e.data["delta"]["partial_json"].get<std::string>();
    }
  }
  EXPECT_EQ(starts, 1);
  EXPECT_EQ(json::parse(partial), json({{"city", "Oslo"}}));
  EXPECT_EQ(ev[ev.size() - 3].name, "content_block_stop");
  EXPECT_EQ(ev[ev.size() - 2].data["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev.back().name, "message_stop");
}

TEST(AnthropicMessages, StopReasons) {
  ScriptedBackend b;
  b.scripts = {Script({"one two"}, llm::FinishReason::stop, "END")};
  json j = json::parse(
      anthropic_messages(
          R"({"max_tokens": 10, "stop_sequences": ["END"], "messages": [{"role": "user", "content": "x"}]})",
          b)
          .body);
  EXPECT_EQ(j["stop_reason"], "stop_sequence");
  EXPECT_EQ(j["stop_sequence"], "END");
  EXPECT_EQ(b.last.settings.stop, std::vector<std::string>{"END"});
  b.scripts = {Script({"one two"}, llm::FinishReason::length)};
  j = json::parse(
      anthropic_messages(R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})", b).body);
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  EXPECT_TRUE(j["stop_sequence"].is_null());
}

TEST(AnthropicMessages, ConversationWithToolResultsAndThinking) {
  ScriptedBackend b;
  const ApiResponse r =
      anthropic_messages(R"({"max_tokens": 10, "system": "Sys", "temperature": 0.2, "top_k": 5, "top_p": 0.8,
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "call it", "signature": "s"},
         {"type": "redacted_thinking", "data": "xx"},
         {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "And tomorrow?"}]}]})",
                         b);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string p = prompt_text(b);
  EXPECT_EQ(p.rfind("<|im_start|>system\nSys\n\n# Tools", 0), 0u) << p;
  EXPECT_NE(
      p.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
      std::string::npos)
      << p;
  EXPECT_NE(
      p.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>user\nAnd "
             "tomorrow?<|im_end|>"),
      std::string::npos)
      << p;
  // No thinking field: Anthropic's thinking is opt-in, so the template is told to skip it.
  EXPECT_TRUE(p.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n")) << p;
  EXPECT_EQ(b.last.settings.sampling.temperature, 0.2);
  EXPECT_EQ(b.last.settings.sampling.top_k, 5);
  EXPECT_EQ(b.last.settings.sampling.top_p, 0.8);
}

TEST(AnthropicMessages, ForcedToolChoice) {
  ScriptedBackend b;
  b.scripts = {Script({"{\"city\": \"Rome\"}}\n</tool_call>"})};
  std::string body = tool_body(false);
  body.insert(body.size() - 1, R"(, "tool_choice": {"type": "tool", "name": "get_weather"})");
  const json j = json::parse(anthropic_messages(body, b).body);
  EXPECT_TRUE(static_cast<bool>(b.last.logits_processor));
  ASSERT_EQ(j["content"].size(), 1u) << j;
  EXPECT_EQ(j["content"][0]["input"], json({{"city", "Rome"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");
}

// Kimi-K2-Thinking: the model writes <think> itself; thinking and tool_use blocks come back in order.
TEST(AnthropicMessages, KimiThinkingAndToolUse) {
  ScriptedBackend b("Kimi-K2-Thinking.jinja");
  EXPECT_EQ(b.info().output_format, OutputFormat::kimi_k2);
  b.scripts = {Script({"<think>Weather tool.</think>On it.<|tool_calls_section_begin|><|tool_call_begin|>",
                       "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": ",
                       "\"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>"})};
  const json j = json::parse(anthropic_messages(tool_body(false), b).body);
  ASSERT_EQ(j["content"].size(), 3u) << j;
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "Weather tool.");
  EXPECT_EQ(j["content"][1], json({{"type", "text"}, {"text", "On it."}}));
  EXPECT_EQ(j["content"][2]["type"], "tool_use");
  EXPECT_EQ(j["content"][2]["name"], "get_weather");
  EXPECT_EQ(j["content"][2]["input"], json({{"city", "Oslo"}}));
  EXPECT_EQ(j["stop_reason"], "tool_use");
  EXPECT_TRUE(prompt_text(b).ends_with("<|im_assistant|>assistant<|im_middle|>")) << prompt_text(b);
}

// Kimi-K2's published templates call list.append, which jinja2's immutable sandbox (transformers' setup,
// which xmoe follows) refuses: a conversation with an earlier tool call is a clear 400, not a crash.
TEST(AnthropicMessages, KimiTemplateRefusesToolHistoryClearly) {
  ScriptedBackend b("Kimi-K2-Instruct.jinja");
  const ApiResponse r = anthropic_messages(R"({"max_tokens": 10,
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    "messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
         "input": {"city": "Oslo"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]})",
                                           b);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("append"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("Kimi-K2-Instruct.jinja"), std::string::npos) << r.body;
}

// GLM-4.6 streamed: a thinking block, then a tool_use block whose input arrives as JSON deltas.
TEST(AnthropicMessages, GlmThinkingAndToolUseStreamed) {
  ScriptedBackend b("GLM-4.6.jinja");
  b.scripts = {Script({"\n<think>Use the tool.</think>\n<tool_call>get_weather\n<arg_key>ci",
                       "ty</arg_key>\n", "<arg_value>Oslo</arg_value>\n</tool_call>"})};
  const std::vector<Event> ev = sse_events(run_stream(anthropic_messages(tool_body(true), b)));
  std::vector<std::string> blocks;
  std::string thinking, partial;
  for (const Event& e : ev) {
    if (e.name == "content_block_start") blocks.push_back(e.data["content_block"]["type"]);
    if (e.name == "content_block_delta" && e.data["delta"]["type"] == "thinking_delta")
      thinking += e.data["delta"]["thinking"].get<std::string>();
    if (e.name == "content_block_delta" && e.data["delta"]["type"] == "input_json_delta")
      partial += e.data["delta"]["partial_json"].get<std::string>();
  }
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "tool_use"}));
  EXPECT_EQ(thinking, "Use the tool.");
  EXPECT_EQ(json::parse(partial), json({{"city", "Oslo"}}));
  EXPECT_EQ(ev[ev.size() - 2].data["delta"]["stop_reason"], "tool_use");
}

TEST(AnthropicMessages, UnknownFieldsAccepted) {
  ScriptedBackend b;
  b.scripts = {Script({"ok"})};
  const ApiResponse r = anthropic_messages(kBasic, b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(prompt_text(b).rfind("<|im_start|>system\nYou are terse.<|im_end|>", 0), 0u);
}

void expect_error(const ApiResponse& r, int status, const std::string& type) {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["type"], "error") << r.body;
  EXPECT_EQ(j["error"]["type"], type) << r.body;
  EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
}

TEST(AnthropicMessages, Errors) {
  ScriptedBackend b;
  expect_error(anthropic_messages("{", b), 400, "invalid_request_error");
  expect_error(anthropic_messages(R"({"messages": [{"role": "user", "content": "x"}]})", b), 400,
               "invalid_request_error");  // max_tokens required
  const ApiResponse image = anthropic_messages(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]})",
                                               b);
  expect_error(image, 400, "invalid_request_error");
  EXPECT_NE(image.body.find("messages[0].content[0]"), std::string::npos);
  expect_error(
      anthropic_messages(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", b), 400,
      "invalid_request_error");
  expect_error(
      anthropic_messages(
          R"({"max_tokens": 5, "thinking": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]})",
          b),
      400, "invalid_request_error");
  EXPECT_EQ(b.submits, 0);
  b.refuse_status = 429;
  expect_error(anthropic_messages(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})", b),
               529, "overloaded_error");
  for (const auto& [status, type] : std::vector<std::pair<int, std::string>>{{400, "invalid_request_error"},
                                                                             {401, "authentication_error"},
                                                                             {403, "permission_error"},
                                                                             {404, "not_found_error"},
                                                                             {413, "request_too_large"},
                                                                             {429, "rate_limit_error"},
                                                                             {500, "api_error"},
                                                                             {529, "overloaded_error"}})
    expect_error(anthropic_error(ApiError(status, "", "m")), status, type);
}

TEST(AnthropicMessages, FailureMidStreamIsAnErrorEvent) {
  ScriptedBackend b;
  b.scripts = {Script({"a", "b", "c"})};
  b.throw_after = 1;
  const std::vector<Event> ev = sse_events(run_stream(anthropic_messages(
      R"({"max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "x"}]})", b)));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().name, "error");
  EXPECT_EQ(ev.back().data["error"]["type"], "api_error");
}

TEST(AnthropicMessages, ClientThatLeavesCancelsTheGeneration) {
  ScriptedBackend b;
  b.scripts = {Script({"a", "b", "c", "d", "e", "f"})};
  run_stream(anthropic_messages(
                 R"({"max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "x"}]})", b),
             /*limit=*/4);
  EXPECT_TRUE(b.log->cancelled);
  EXPECT_LT(b.log->delivered, 6);
}

TEST(AnthropicCountTokens, CountsTheRenderedPrompt) {
  ScriptedBackend b;
  const ApiResponse r = anthropic_count_tokens(
      R"({"model": "c", "system": "Sys", "messages": [{"role": "user", "content": "Hello there"}]})", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string rendered =
      "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHello "
      "there<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
      "</think>\n\n";
  EXPECT_EQ(json::parse(r.body), json({{"input_tokens", b.tokenizer_.encode(rendered).size()}}));
  EXPECT_EQ(b.submits, 0);
  expect_error(anthropic_count_tokens(R"({"messages": 3})", b), 400, "invalid_request_error");
}

}  // namespace
}  // namespace xmoe::serve
