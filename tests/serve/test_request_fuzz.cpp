// A bounded randomized test of the request parsers: thousands of mutated valid bodies (fields removed,
// values swapped for other JSON types, bytes truncated, flipped or inserted) through every handler, streams
// played to the end. No exception may escape, no response may be a 500, and every error body must have the
// API's error shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "scripted_backend.hpp"

namespace xmoe::serve {
namespace {

using ojson = nlohmann::ordered_json;
using testing::Script;
using testing::ScriptedBackend;

const char* kOpenAISeeds[] = {
    R"({"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
       {"role": "assistant", "content": null, "reasoning_content": "r", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
       "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object",
        "properties": {"a": {"type": "integer"}}}}}], "tool_choice": {"type": "function", "function": {"name": "f"}},
       "max_tokens": 20, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "stop": ["x"], "seed": 3, "n": 2,
       "presence_penalty": 0.1, "frequency_penalty": 0.1, "logprobs": true, "top_logprobs": 2, "stream": true,
       "stream_options": {"include_usage": true}, "response_format": {"type": "json_object"},
       "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": true}})",
    R"({"prompt": "hello", "max_tokens": 5, "n": 1, "logprobs": 2, "stream": false, "stop": "x", "echo": false})",
    R"({"prompt": [1, 2, 3], "stream": true})",
};

const char* kAnthropicSeeds[] = {
    R"({"model": "claude", "max_tokens": 30, "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
       "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t",
        "signature": "x"}, {"type": "text", "text": "a"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}]},
        {"type": "text", "text": "more"}]}], "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
       "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 5}, "stop_sequences": ["q"],
       "temperature": 0.5, "top_p": 0.9, "top_k": 3, "metadata": {"user_id": "u"}, "stream": true})",
    R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "f"},
       "tools": [{"name": "f", "input_schema": {}}]})",
};

ojson random_value(std::mt19937_64& g, int depth = 0) {
  switch (g() % (depth > 2 ? 7 : 9)) {
    case 0:
      return nullptr;
    case 1:
      return static_cast<bool>(g() % 2);
    case 2:
      return static_cast<int64_t>(g() % 5) - 2;
    case 3:
      return static_cast<int64_t>(g());  // huge
    case 4:
      return (static_cast<double>(g() % 2000) - 1000) / 7.0;
    case 5:
      return std::string(g() % 4, static_cast<char>('a' + g() % 26));
    case 6:
      return std::string("\xff\xfe<tool_call>{\"");
    case 7: {
      ojson a = ojson::array();
      for (int i = static_cast<int>(g() % 3); i > 0; --i) a.push_back(random_value(g, depth + 1));
      return a;
    }
    default: {
      ojson o = ojson::object();
      for (const char* k : {"type", "text", "name", "content", "role", "function"})
        if (g() % 3 == 0) o[k] = random_value(g, depth + 1);
      return o;
    }
  }
}

// Picks a random node of the document and removes or replaces it.
void mutate_tree(ojson& j, std::mt19937_64& g) {
  ojson* node = &j;
  for (int depth = 0; depth < 6; ++depth) {
    if (!(node->is_object() || node->is_array()) || node->empty() || g() % 3 == 0) break;
    const size_t i = g() % node->size();
    ojson* child = node->is_array() ? &(*node)[i] : &(std::next(node->begin(), static_cast<long>(i)).value());
    if (!(child->is_object() || child->is_array()) || g() % 2 == 0) {
      if (g() % 3 == 0) {
        if (node->is_array())
          node->erase(i);
        else
          node->erase(std::next(node->begin(), static_cast<long>(i)).key());
      } else {
        *child = random_value(g);
      }
      return;
    }
    node = child;
  }
  *node = random_value(g);
}

std::string mutate(const std::string& seed, std::mt19937_64& g) {
  ojson j = ojson::parse(seed);
  for (int k = 1 + static_cast<int>(g() % 2); k > 0; --k) mutate_tree(j, g);
  std::string s = j.dump(-1, ' ', false, ojson::error_handler_t::replace);
  switch (g() % 10) {
    case 0:
      s.resize(g() % (s.size() + 1));
      break;
    case 1:
      if (!s.empty()) s[g() % s.size()] = static_cast<char>(g() % 256);
      break;
    case 2:
      s.insert(g() % (s.size() + 1), 1, "{}[]\",:\\0\x80"[g() % 10]);
      break;
    default:
      break;
  }
  return s;
}

void check(const ApiResponse& r, bool anthropic, const std::string& body) {
  ASSERT_NE(r.status, 500) << body << "\n→ " << r.body;
  ASSERT_TRUE(r.status == 200 || r.status == 400 || r.status == 429 || r.status == 529)
      << r.status << " " << r.body;
  if (r.status != 200) {
    const auto e = nlohmann::json::parse(r.body, nullptr, false);
    if (anthropic) {
      ASSERT_EQ(e["type"], "error") << r.body;
      ASSERT_TRUE(e["error"]["type"].is_string() && e["error"]["message"].is_string()) << r.body;
    } else {
      ASSERT_TRUE(e["error"]["message"].is_string() && e["error"]["type"].is_string()) << r.body;
    }
  }
  testing::run_stream(r);
}

TEST(RequestFuzz, MutatedBodiesNeverCrashOrAnswer500) {
  ScriptedBackend b;
  b.scripts = {Script({"<think>a</think>", "b<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\"",
                       ": 1}}\n</tool_call>"}),
               Script({"x"}, llm::FinishReason::length)};
  // Each seed is a valid request for one of the two OpenAI endpoints.
  for (const char* seed : kOpenAISeeds) {
    const int chat = openai_chat_completions(seed, b).status, completion = openai_completions(seed, b).status;
    EXPECT_TRUE((chat == 200) != (completion == 200)) << seed;
  }
  for (const char* seed : kAnthropicSeeds) EXPECT_EQ(anthropic_messages(seed, b).status, 200) << seed;
  std::mt19937_64 g(20261203);
  constexpr int kRounds = 1500;
  int ok = 0;
  for (int round = 0; round < kRounds; ++round) {
    for (const char* seed : kOpenAISeeds) {
      const std::string body = mutate(seed, g);
      const ApiResponse chat = openai_chat_completions(body, b);
      check(chat, false, body);
      check(openai_completions(body, b), false, body);
      check(tutel_chat(body, b), false, body);
      ok += chat.status == 200;
    }
    for (const char* seed : kAnthropicSeeds) {
      const std::string body = mutate(seed, g);
      const ApiResponse msg = anthropic_messages(body, b);
      check(msg, true, body);
      check(anthropic_count_tokens(body, b), true, body);
      ok += msg.status == 200;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The mutations must leave many requests valid, or the handlers' success paths go unfuzzed.
  EXPECT_GT(ok, kRounds / 4);
}

}  // namespace
}  // namespace xmoe::serve
