// The OpenAI adapter against a scripted backend: response bodies, the exact chunk sequence of streams (as
// formats-and-apis.md "HTTP APIs" gives OpenAI's), tool calls, thinking, n > 1, usage, stop reasons, errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "scripted_backend.hpp"

namespace xmoe::serve {
namespace {

using nlohmann::json;
using testing::run_stream;
using testing::Script;
using testing::ScriptedBackend;

// "data: X\n\n" events; the last must be [DONE].
std::vector<json> sse_data(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  bool done = false;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    EXPECT_FALSE(done) << "event after [DONE]";
    if (ev == "data: [DONE]") {
      done = true;
      continue;
    }
    out.push_back(json::parse(ev.substr(6)));
  }
  EXPECT_TRUE(done) << "no [DONE]";
  return out;
}

int64_t count_tokens(const ScriptedBackend& b, const std::vector<std::string>& pieces) {
  int64_t n = 0;
  for (const std::string& p : pieces) n += static_cast<int64_t>(b.tokenizer_.encode(p).size());
  return n;
}

std::string prompt_text(const ScriptedBackend& b) {
  return b.tokenizer_.decode(b.last.prompt);
}

const char* kHello = R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi"}]})";

TEST(OpenAIChat, NonStreamedAnswerWithThinkingAndUsage) {
  ScriptedBackend b;
  b.scripts = {Script{{"<think>\nhm, ", "a greeting\n</think>\n\n", "Hello", " world"}}};
  const ApiResponse r = openai_chat_completions(kHello, b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(r.stream);
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hello world");
  EXPECT_EQ(c["message"]["reasoning_content"], "hm, a greeting");
  EXPECT_FALSE(c["message"].contains("tool_calls"));
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_TRUE(c["logprobs"].is_null());
  // The prompt is the chat template's rendering, tokenized; usage counts the tokenizer's tokens.
  EXPECT_EQ(
      prompt_text(b),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(j["usage"]["prompt_tokens"], b.last.prompt.size());
  const int64_t completion = count_tokens(b, b.scripts[0].pieces);
  EXPECT_EQ(j["usage"]["completion_tokens"], completion);
  EXPECT_EQ(j["usage"]["total_tokens"], static_cast<int64_t>(b.last.prompt.size()) + completion);
}

TEST(OpenAIChat, StreamChunkSequence) {
  ScriptedBackend b;
  b.scripts = {Script{{"<think>\nhm", "\n</thi", "nk>\n\nHel", "lo"}}};
  const ApiResponse r = openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "Hi"}], "stream": true, "stream_options": {"include_usage": true}})",
      b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/event-stream");
  const std::vector<json> chunks = sse_data(run_stream(r));
  ASSERT_GE(chunks.size(), 5u);
  for (const json& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], chunks[0]["id"]);
    EXPECT_EQ(c["model"], "tiny-qwen3");  // the served name when the request names none
    EXPECT_TRUE(c.contains("usage"));
  }
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(chunks[0]["usage"].is_null());
  std::string reasoning, content;
  size_t i = 1;
  for (; i < chunks.size() && !chunks[i]["choices"].empty() &&
         chunks[i]["choices"][0]["finish_reason"].is_null();
       ++i) {
    const json& d = chunks[i]["choices"][0]["delta"];
    ASSERT_EQ(d.size(), 1u) << d;
    if (d.contains("reasoning_content")) {
      EXPECT_TRUE(content.empty()) << "reasoning after content";
      reasoning += d["reasoning_content"].get<std::string>();
    } else {
      content += d["content"].get<std::string>();
    }
  }
  EXPECT_EQ(reasoning, "hm");
  EXPECT_EQ(content, "Hello");
  ASSERT_EQ(i + 2, chunks.size());
  EXPECT_EQ(chunks[i]["choices"][0]["delta"], json::object());
  EXPECT_EQ(chunks[i]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(chunks[i + 1]["choices"].empty());
  EXPECT_EQ(chunks[i + 1]["usage"]["prompt_tokens"], b.last.prompt.size());
  EXPECT_EQ(chunks[i + 1]["usage"]["completion_tokens"], count_tokens(b, b.scripts[0].pieces));
}

const char* kToolRequest = R"({"messages": [{"role": "user", "content": "Weather in Paris?"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}])";

TEST(OpenAIChat, ToolCallNonStreamed) {
  ScriptedBackend b;
  b.scripts = {Script{{"<tool_call>\n{\"name\": \"get_weather\", ",
                       "\"arguments\": {\"location\": \"Paris\"}}\n</tool_call>"}}};
  const ApiResponse r = openai_chat_completions(std::string(kToolRequest) + "}", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  const json& call = c["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"location", "Paris"}}));
  // The tools reach the template (Qwen3 lists them in the system turn).
  EXPECT_NE(prompt_text(b).find("\"name\": \"get_weather\""), std::string::npos);
}

TEST(OpenAIChat, ToolCallStreamedAsFragments) {
  ScriptedBackend b;
  b.scripts = {Script{{"Let me see.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"loc",
                       "ation\": ", "\"Paris\"}}\n</tool_call>"}}};
  const ApiResponse r = openai_chat_completions(std::string(kToolRequest) + R"(, "stream": true})", b);
  const std::vector<json> chunks = sse_data(run_stream(r));
  ASSERT_GE(chunks.size(), 5u);
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], json({{"content", "Let me see."}}));
  const json& first = chunks[2]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(first["index"], 0);
  EXPECT_EQ(first["type"], "function");
  EXPECT_EQ(first["function"]["name"], "get_weather");
  EXPECT_EQ(first["function"]["arguments"], "");
  EXPECT_EQ(first["id"].get<std::string>().rfind("call_", 0), 0u);
  std::string args;
  size_t i = 3;
  for (; chunks[i]["choices"][0]["finish_reason"].is_null(); ++i) {
    const json& frag = chunks[i]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(frag.size(), 2u) << frag;  // only index and function.arguments
    EXPECT_EQ(frag["index"], 0);
    args += frag["function"]["arguments"].get<std::string>();
  }
  EXPECT_GE(i, 5u) << "arguments should arrive in several fragments";
  EXPECT_EQ(json::parse(args), json({{"location", "Paris"}}));
  EXPECT_EQ(chunks[i]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chunks[i]["choices"][0]["delta"], json::object());
  EXPECT_EQ(i + 1, chunks.size());
  EXPECT_FALSE(chunks[0].contains("usage"));  // without include_usage
}

TEST(OpenAIChat, SeveralChoicesAndFinishReasons) {
  ScriptedBackend b;
  b.scripts = {Script{{"one ", "two"}, llm::FinishReason::stop, "END"},
               Script{{"three ", "four"}, llm::FinishReason::length}};
  const ApiResponse r = openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "count"}], "n": 2, "stop": ["END"], "seed": 7, "temperature": 0.5,
          "top_p": 0.9, "top_k": 20, "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
          "max_tokens": 9, "max_completion_tokens": 11, "unknown_field": {"x": 1}})",
      b);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "one two");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][1]["message"]["content"], "three four");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], count_tokens(b, {"one ", "two", "three ", "four"}));
  const GenerationSettings& s = b.last.settings;
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.sampling.seed, 7u);
  EXPECT_EQ(s.sampling.temperature, 0.5);
  EXPECT_EQ(s.sampling.top_p, 0.9);
  EXPECT_EQ(s.sampling.top_k, 20);
  EXPECT_EQ(s.sampling.min_p, 0.1);
  EXPECT_EQ(s.sampling.presence_penalty, 0.5);
  EXPECT_EQ(s.sampling.frequency_penalty, 0.25);
  EXPECT_EQ(b.last.max_tokens, 11);  // max_completion_tokens wins
}

TEST(OpenAIChat, SeveralChoicesStreamed) {
  ScriptedBackend b;
  b.scripts = {Script{{"a", "b"}}, Script{{"c"}, llm::FinishReason::length}};
  const std::vector<json> chunks = sse_data(run_stream(openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "x"}], "n": 2, "stream": true})", b)));
  std::map<int, std::string> text, finish;
  std::map<int, int> roles;
  for (const json& c : chunks) {
    const json& ch = c["choices"][0];
    const int i = ch["index"];
    if (ch["delta"].contains("role")) ++roles[i];
    if (ch["delta"].contains("content")) text[i] += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
  }
  EXPECT_EQ(roles[0], 1);
  EXPECT_EQ(roles[1], 1);
  EXPECT_EQ(text[0], "ab");
  EXPECT_EQ(text[1], "c");
  EXPECT_EQ(finish[0], "stop");
  EXPECT_EQ(finish[1], "length");
}

TEST(OpenAIChat, Logprobs) {
  ScriptedBackend b;
  b.scripts = {Script{{"Hello there"}}};
  const json j = json::parse(
      openai_chat_completions(
          R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 2})", b)
          .body);
  EXPECT_TRUE(b.last.settings.logprobs);
  EXPECT_EQ(b.last.settings.top_logprobs, 2);
  const json& content = j["choices"][0]["logprobs"]["content"];
  const auto ids = b.tokenizer_.encode("Hello there");
  ASSERT_EQ(content.size(), ids.size());
  std::string joined;
  for (const json& t : content) {
    joined += t["token"].get<std::string>();
    EXPECT_EQ(t["logprob"], -0.5);
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
  }
  EXPECT_EQ(joined, "Hello there");
}

TEST(OpenAIChat, ContentPartsRolesAndToolHistory) {
  ScriptedBackend b;
  const ApiResponse r = openai_chat_completions(R"({"messages": [
      {"role": "developer", "content": [{"type": "text", "text": "Sys "}, {"type": "text", "text": "two"}]},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]})",
                                                b);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string p = prompt_text(b);
  EXPECT_EQ(p.rfind("<|im_start|>system\nSys two\n\n# Tools", 0), 0u) << p;
  EXPECT_NE(
      p.find(
          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}\n</tool_call>"),
      std::string::npos)
      << p;
  EXPECT_NE(
      p.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
      std::string::npos)
      << p;
}

TEST(OpenAIChat, ThinkingSwitches) {
  ScriptedBackend b;
  const std::string no_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  auto ends_with = [](const std::string& s, const std::string& t) {
    return s.size() >= t.size() && s.ends_with(t);
  };
  openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none"})",
                          b);
  EXPECT_TRUE(ends_with(prompt_text(b), no_think));
  openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}})",
      b);
  EXPECT_TRUE(ends_with(prompt_text(b), no_think));
  openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high"})",
                          b);
  EXPECT_FALSE(ends_with(prompt_text(b), no_think));
}

TEST(OpenAIChat, ForcedToolCallAndJsonObject) {
  ScriptedBackend b;
  b.scripts = {Script{{"{\"location\": \"Rome\"}}\n</tool_call>"}}};
  const ApiResponse r = openai_chat_completions(
      std::string(kToolRequest) +
          R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})",
      b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(prompt_text(b).ends_with(
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "));
  EXPECT_TRUE(static_cast<bool>(b.last.logits_processor));
  const json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["arguments"], "{\"location\": \"Rome\"}");

  openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})", b);
  EXPECT_TRUE(static_cast<bool>(b.last.logits_processor));
  openai_chat_completions(std::string(kToolRequest) + R"(, "tool_choice": "none"})", b);
  EXPECT_FALSE(static_cast<bool>(b.last.logits_processor));
  EXPECT_EQ(prompt_text(b).find("get_weather"), std::string::npos);  // tools not offered for "none"
}

TEST(OpenAIChat, MaxTokensFitTheContext) {
  ScriptedBackend b;
  openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000000})", b);
  EXPECT_EQ(b.last.max_tokens, b.info_.max_seq_len - static_cast<int64_t>(b.last.prompt.size()));
  openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}]})", b);
  EXPECT_EQ(b.last.max_tokens, b.info_.max_seq_len - static_cast<int64_t>(b.last.prompt.size()));
  b.info_.max_seq_len = 5;
  const ApiResponse r = openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}]})", b);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("max_seq_len"),
            std::string::npos);
}

void expect_error(const ApiResponse& r, int status, const std::string& type, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = json::parse(r.body);
  ASSERT_TRUE(j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_EQ(e["type"], type) << r.body;
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
  EXPECT_TRUE(e.contains("code"));
  if (param.empty())
    EXPECT_TRUE(e["param"].is_null()) << r.body;
  else
    EXPECT_EQ(e["param"], param) << r.body;
}

TEST(OpenAIChat, BadRequestsNameTheField) {
  ScriptedBackend b;
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  expect_error(openai_chat_completions("{not json", b), 400, "invalid_request_error", "body");
  expect_error(openai_chat_completions("[1]", b), 400, "invalid_request_error", "body");
  expect_error(openai_chat_completions("{}", b), 400, "invalid_request_error", "messages");
  expect_error(
      openai_chat_completions(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
      {"type": "image_url", "image_url": {"url": "data:"}}]}]})",
                              b),
      400, "invalid_request_error", "messages[0].content[1]");
  expect_error(openai_chat_completions(R"({"messages": [{"role": "robot", "content": "x"}]})", b), 400,
               "invalid_request_error", "messages[0].role");
  expect_error(openai_chat_completions("{" + user + R"(, "temperature": "hot"})", b), 400,
               "invalid_request_error", "temperature");
  expect_error(openai_chat_completions("{" + user + R"(, "top_p": 0})", b), 400, "invalid_request_error",
               "top_p");
  expect_error(openai_chat_completions("{" + user + R"(, "max_tokens": 0})", b), 400, "invalid_request_error",
               "max_tokens");
  expect_error(openai_chat_completions("{" + user + R"(, "n": 100})", b), 400, "invalid_request_error", "n");
  expect_error(openai_chat_completions("{" + user + R"(, "stop": [1]})", b), 400, "invalid_request_error",
               "stop[0]");
  expect_error(openai_chat_completions("{" + user + R"(, "tool_choice": "required"})", b), 400,
               "invalid_request_error", "tool_choice");
  expect_error(openai_chat_completions(std::string(kToolRequest) + R"(, "tool_choice": {"type": "function",
               "function": {"name": "nope"}}})",
                                       b),
               400, "invalid_request_error", "tool_choice");
  expect_error(openai_chat_completions("{" + user + R"(, "response_format": {"type": "yaml"}})", b), 400,
               "invalid_request_error", "response_format.type");
  EXPECT_EQ(b.submits, 0);
  b.refuse_status = 429;
  const ApiResponse full = openai_chat_completions("{" + user + "}", b);
  expect_error(full, 429, "rate_limit_error", "");
  EXPECT_EQ(json::parse(full.body)["error"]["code"], "rate_limit_exceeded");
}

TEST(OpenAIChat, ClientThatLeavesCancelsTheGeneration) {
  ScriptedBackend b;
  b.scripts = {Script{{"a", "b", "c", "d", "e"}}};
  const ApiResponse r =
      openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}], "stream": true})", b);
  run_stream(r, /*limit=*/2);
  EXPECT_TRUE(b.log->cancelled);
  EXPECT_LT(b.log->delivered, 5);
}

TEST(OpenAIChat, FailureMidStreamIsAnErrorEvent) {
  ScriptedBackend b;
  b.scripts = {Script{{"a", "b", "c"}}};
  b.throw_after = 1;
  const std::vector<json> chunks = sse_data(run_stream(
      openai_chat_completions(R"({"messages": [{"role": "user", "content": "x"}], "stream": true})", b)));
  ASSERT_GE(chunks.size(), 2u);
  EXPECT_EQ(chunks.back()["error"]["type"], "server_error");
  EXPECT_EQ(chunks.back()["error"]["message"], "engine failure");
}

TEST(OpenAICompletions, TextAndTokenPrompts) {
  ScriptedBackend b;
  b.scripts = {Script{{" there", " friend"}, llm::FinishReason::length}};
  ApiResponse r =
      openai_completions(R"({"model": "x", "prompt": "Hello", "max_tokens": 5, "logprobs": 1})", b);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], " there friend");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), b.tokenizer_.encode(" there friend").size());
  EXPECT_EQ(b.last.prompt, b.tokenizer_.encode("Hello", true));
  EXPECT_EQ(b.last.max_tokens, 5);
  EXPECT_EQ(j["usage"]["prompt_tokens"], b.last.prompt.size());

  r = openai_completions(
      R"({"prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}})", b);
  EXPECT_EQ(b.last.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(b.last.max_tokens, 16);  // the API's default
  const std::vector<json> chunks = sse_data(run_stream(r));
  std::string text;
  for (const json& c : chunks) {
    EXPECT_EQ(c["object"], "text_completion");
    if (!c["choices"].empty()) text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, " there friend");
  EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(chunks.back()["usage"]["prompt_tokens"], 3);

  expect_error(openai_completions(R"({"prompt": [1, -2]})", b), 400, "invalid_request_error", "prompt[1]");
  expect_error(openai_completions(R"({"prompt": ["a", "b"]})", b), 400, "invalid_request_error", "prompt");
  expect_error(openai_completions(R"({})", b), 400, "invalid_request_error", "prompt");
}

// gpt-oss: the harmony template gets reasoning_effort; its channels come back as reasoning, content and tool
// calls.
TEST(OpenAIChat, HarmonyReasoningEffortChannelsAndToolCall) {
  ScriptedBackend b("openai-gpt-oss-120b.jinja");
  EXPECT_EQ(b.info().output_format, OutputFormat::harmony);
  b.scripts = {Script{{"<|channel|>analysis<|message|>hm, ", "a greeting<|end|><|start|>assistant<|channel|>",
                       "final<|message|>Hello", " world"}}};
  ApiResponse r = openai_chat_completions(
      R"({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"})", b);
  ASSERT_EQ(r.status, 200) << r.body;
  json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["message"]["content"], "Hello world");
  EXPECT_EQ(c["message"]["reasoning_content"], "hm, a greeting");
  EXPECT_NE(prompt_text(b).find("\nReasoning: low\n"), std::string::npos) << prompt_text(b);
  EXPECT_TRUE(prompt_text(b).ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));

  b.scripts = {
      Script{{"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary ",
              "to=functions.get_weather <|constrain|>json<|message|>{\"location\": ", "\"Paris\"}"}}};
  r = openai_chat_completions(std::string(kToolRequest) + "}", b);
  ASSERT_EQ(r.status, 200) << r.body;
  c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "Need weather.");
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"location", "Paris"}}));
  EXPECT_NE(prompt_text(b).find("type get_weather = (_: {"), std::string::npos) << prompt_text(b);
}

// DeepSeek-V3.1: `thinking` (a template keyword) opens <think> in the prompt; the answer's reasoning, text
// and calls come back as OpenAI fields, and an earlier call in the conversation is rendered in DeepSeek's
// markup.
TEST(OpenAIChat, DeepseekThinkingAndToolCalls) {
  ScriptedBackend b("deepseek-ai-DeepSeek-V3.1.jinja");
  EXPECT_EQ(b.info().output_format, OutputFormat::deepseek_v3);
  b.scripts = {
      Script{{"The user wants weather.</th", "ink>Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_",
              "weather<｜tool▁sep｜>{\"location\": \"Pa", "ris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}}};
  std::string body = kToolRequest;
  body.insert(body.find("\"tools\""), R"("chat_template_kwargs": {"thinking": true}, )");
  body.replace(body.find(R"([{"role": "user", "content": "Weather in Paris?"}])"), 50,
               R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls":
                  [{"id": "call_0", "type": "function", "function": {"name": "get_weather",
                  "arguments": "{\"location\": \"Rome\"}"}}]}, {"role": "tool", "tool_call_id": "call_0",
                  "content": "sunny"}, {"role": "user", "content": "Weather in Paris?"}])");
  ApiResponse r = openai_chat_completions(body + "}", b);
  ASSERT_EQ(r.status, 200) << r.body;
  json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_EQ(c["message"]["reasoning_content"], "The user wants weather.");
  EXPECT_EQ(c["message"]["content"], "Checking.");
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(c["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"location", "Paris"}}));
  const std::string p = prompt_text(b);
  EXPECT_NE(
      p.find("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Rome\"}<｜tool▁call▁end｜>"),
      std::string::npos)
      << p;
  EXPECT_TRUE(p.ends_with("<｜User｜>Weather in Paris?<｜Assistant｜><think>")) << p;

  // Streamed: the same call as fragments.
  r = openai_chat_completions(body + R"(, "stream": true})", b);
  std::string reasoning, args;
  for (const json& chunk : sse_data(run_stream(r))) {
    if (chunk["choices"].empty()) continue;
    const json& d = chunk["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("tool_calls")) args += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "The user wants weather.");
  EXPECT_EQ(json::parse(args), json({{"location", "Paris"}}));

  // A named call: the prompt closes the thinking and opens the call; the arguments are forced JSON, and the
  // output ending after the object (the end-of-turn token) ends the call.
  b.scripts = {Script{{"{\"location\": ", "\"Rome\"}"}}};
  r = openai_chat_completions(
      body + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(prompt_text(b).ends_with(
      "<｜Assistant｜><think></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"))
      << prompt_text(b);
  EXPECT_TRUE(static_cast<bool>(b.last.logits_processor));
  c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_FALSE(c["message"].contains("reasoning_content")) << c;
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"location", "Rome"}}));
}

// GLM-4.7: the prompt opens <think> by default; arguments written as <arg_key>/<arg_value> come back as JSON
// typed by the tool's schema. A forced call closes the thinking first.
TEST(OpenAIChat, GlmToolCallAndForcedCall) {
  ScriptedBackend b("GLM-4.7-Flash.jinja");
  EXPECT_EQ(b.info().output_format, OutputFormat::glm4);
  b.scripts = {Script{{"Weather needed.</think><tool_call>get_weather<arg_key>location</arg_key><arg_",
                       "value>Paris</arg_value></tool_call>"}}};
  ApiResponse r = openai_chat_completions(std::string(kToolRequest) + "}", b);
  ASSERT_EQ(r.status, 200) << r.body;
  json c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["message"]["reasoning_content"], "Weather needed.");
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"location", "Paris"}}));

  b.scripts = {Script{{"<arg_key>location</arg_key><arg_value>Rome</arg_value></tool_call>"}}};
  r = openai_chat_completions(
      std::string(kToolRequest) +
          R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})",
      b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(prompt_text(b).ends_with("<|assistant|><think></think><tool_call>get_weather"))
      << prompt_text(b);
  c = json::parse(r.body)["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls");
  EXPECT_FALSE(c["message"].contains("reasoning_content")) << c;
  EXPECT_EQ(json::parse(c["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"location", "Rome"}}));
}

TEST(OpenAIModels, ListsTheServedModel) {
  ScriptedBackend b;
  const json j = json::parse(openai_models(b).body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny-qwen3");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 1700000000);
}

TEST(TutelChat, StreamsPlainText) {
  ScriptedBackend b;
  b.scripts = {Script{{"Hi", " there"}}};
  const ApiResponse r = tutel_chat(R"({"text": "hello", "max_tokens": 4})", b);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(run_stream(r), "Hi there");
  EXPECT_EQ(b.last.max_tokens, 4);
  EXPECT_TRUE(prompt_text(b).ends_with("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(tutel_chat("{}", b).status, 400);
}

}  // namespace
}  // namespace xmoe::serve
