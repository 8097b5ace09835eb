// OpenAI-compatible API: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
#include <map>

#include "serve/adapter_common.hpp"
#include "serve/api.hpp"
#include "serve/openai_request.hpp"

namespace xmoe::serve {

using adapter::dump;
using adapter::ojson;

namespace {

constexpr int kMaxChoices = 16;

ApiResponse json_response(const ojson& body) {
  ApiResponse r;
  r.body = dump(body);
  return r;
}

std::string sse(const ojson& chunk) {
  return "data: " + dump(chunk) + "\n\n";
}

ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

ojson logprobs_content(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (const TokenLogprob& lp : lps) {
    const std::string text = adapter::token_text(tok, lp.token);
    ojson top = ojson::array();
    for (const auto& [t, l] : lp.top) {
      const std::string tt = adapter::token_text(tok, t);
      top.push_back(ojson{{"token", tt}, {"logprob", l}, {"bytes", bytes_of(tt)}});
    }
    content.push_back(
        ojson{{"token", text}, {"logprob", lp.logprob}, {"bytes", bytes_of(text)}, {"top_logprobs", top}});
  }
  return ojson{{"content", content}};
}

const char* chat_finish_reason(const adapter::ChoiceOutput& c) {
  if (c.finish == llm::FinishReason::length) return "length";
  return c.tool_calls.empty() ? "stop" : "tool_calls";
}

ojson usage_json(int64_t prompt, int64_t completion) {
  return ojson{
      {"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
}

ApiResponse error_or_rethrow(const ApiError& e) {
  return openai_error(e);
}

// The stream of one chat completion: chunks as the parser settles output, per choice.
struct ChatStream {
  std::unique_ptr<GenerationStream> stream;
  ChatRequest request;
  OutputParserOptions parser_options;
  OutputFormat format;
  const Tokenizer* tokenizer;
  std::string id, model;
  int64_t created;

  void run(StreamWriter& w) {
    const int n = request.generation.n;
    auto chunk = [&](ojson choices) {
      ojson c{{"id", id},       {"object", "chat.completion.chunk"}, {"created", created},
              {"model", model}, {"system_fingerprint", nullptr},     {"choices", std::move(choices)}};
      if (request.include_usage) c["usage"] = nullptr;
      return c;
    };
    auto choice = [](int index, ojson delta, ojson finish = nullptr, ojson logprobs = nullptr) {
      return ojson::array({ojson{{"index", index},
                                 {"delta", std::move(delta)},
                                 {"logprobs", std::move(logprobs)},
                                 {"finish_reason", std::move(finish)}}});
    };
    auto send = [&](const ojson& c) {
      if (w.write(sse(c))) return true;
      stream->cancel();
      return false;
    };
    std::vector<adapter::ChoiceOutput> out(n);
    std::vector<std::unique_ptr<OutputParser>> parsers;
    for (int i = 0; i < n; ++i) {
      parsers.push_back(make_output_parser(format, parser_options));
      if (!send(chunk(choice(i, ojson{{"role", "assistant"}, {"content", ""}})))) return;
    }
    int64_t completion_tokens = 0;
    try {
      GenerationDelta d;
      std::vector<OutputEvent> events;
      while (stream->next(d)) {
        if (d.index < 0 || d.index >= n) continue;
        adapter::ChoiceOutput& c = out[d.index];
        completion_tokens += static_cast<int64_t>(d.tokens.size());
        events.clear();
        parsers[d.index]->push(d.text, events);
        if (d.finish != llm::FinishReason::none) parsers[d.index]->finish(events);
        ojson logprobs = request.generation.logprobs && !d.logprobs.empty() && tokenizer
                             ? logprobs_content(*tokenizer, d.logprobs)
                             : ojson(nullptr);
        for (const OutputEvent& e : events) {
          ojson delta;
          switch (e.kind) {
            case OutputEvent::Kind::text:
              delta = ojson{{"content", e.text}};
              break;
            case OutputEvent::Kind::thinking:
              delta = ojson{{"reasoning_content", e.text}};
              break;
            case OutputEvent::Kind::tool_call_begin: {
              adapter::apply_events({e}, c, "call_");
              const ToolCall& call = c.tool_calls.back();
              delta =
                  ojson{{"tool_calls",
                         ojson::array({ojson{{"index", e.tool_index},
                                             {"id", call.id},
                                             {"type", "function"},
                                             {"function", ojson{{"name", call.name}, {"arguments", ""}}}}})}};
              break;
            }
            case OutputEvent::Kind::tool_call_arguments:
              delta =
                  ojson{{"tool_calls", ojson::array({ojson{{"index", e.tool_index},
                                                           {"function", ojson{{"arguments", e.text}}}}})}};
              break;
            case OutputEvent::Kind::tool_call_end:
              continue;
          }
          if (!send(chunk(choice(d.index, std::move(delta), nullptr, std::move(logprobs))))) return;
          logprobs = nullptr;
        }
        if (!logprobs.is_null() &&
            !send(chunk(choice(d.index, ojson::object(), nullptr, std::move(logprobs)))))
          return;
        if (d.finish != llm::FinishReason::none) {
          c.finish = d.finish;
          if (!send(chunk(choice(d.index, ojson::object(), chat_finish_reason(c))))) return;
        }
      }
    } catch (const std::exception& e) {
      // The status line is long gone: the failure goes out as an error event, then the stream ends.
      w.write(sse(ojson{
          {"error",
           ojson{{"message", e.what()}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}));
      w.write("data: [DONE]\n\n");
      return;
    }
    if (request.include_usage) {
      ojson u = chunk(ojson::array());
      u["usage"] = usage_json(stream->prompt_tokens(), completion_tokens);
      if (!send(u)) return;
    }
    w.write("data: [DONE]\n\n");
  }
};

ApiResponse chat_completions(std::string_view body, Backend& backend) {
  const ojson j = adapter::parse_body(body);
  ChatRequest request = parse_openai_chat_request(j, backend.info());
  adapter::PreparedChat p = adapter::prepare_chat(request, backend);
  const ModelInfo& info = backend.info();
  std::unique_ptr<GenerationStream> stream = backend.submit(std::move(p.submit));
  const std::string id = adapter::make_id("chatcmpl-");
  const int64_t created = adapter::unix_now();
  const std::string model = request.model.empty() ? info.served_name : request.model;
  if (request.stream) {
    auto state =
        std::make_shared<ChatStream>(ChatStream{std::move(stream), std::move(request), std::move(p.parser),
                                                info.output_format, info.tokenizer, id, model, created});
    ApiResponse r;
    r.content_type = "text/event-stream";
    r.stream = [state](StreamWriter& w) { state->run(w); };
    return r;
  }
  const int n = request.generation.n;
  std::vector<adapter::ChoiceOutput> out =
      adapter::collect(*stream, n, p.parser, info.output_format, "call_");
  ojson choices = ojson::array();
  int64_t completion_tokens = 0;
  for (int i = 0; i < n; ++i) {
    const adapter::ChoiceOutput& c = out[i];
    completion_tokens += c.tokens;
    ojson message{{"role", "assistant"}};
    message["content"] = c.text.empty() && !c.tool_calls.empty() ? ojson(nullptr) : ojson(c.text);
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ToolCall& t : c.tool_calls)
        calls.push_back(ojson{{"id", t.id},
                              {"type", "function"},
                              {"function", ojson{{"name", t.name}, {"arguments", t.arguments}}}});
      message["tool_calls"] = std::move(calls);
    }
    ojson logprobs = request.generation.logprobs && info.tokenizer
                         ? logprobs_content(*info.tokenizer, c.logprobs)
                         : ojson(nullptr);
    choices.push_back(ojson{{"index", i},
                            {"message", std::move(message)},
                            {"logprobs", std::move(logprobs)},
                            {"finish_reason", chat_finish_reason(c)}});
  }
  return json_response(ojson{{"id", id},
                             {"object", "chat.completion"},
                             {"created", created},
                             {"model", model},
                             {"system_fingerprint", nullptr},
                             {"choices", std::move(choices)},
                             {"usage", usage_json(stream->prompt_tokens(), completion_tokens)}});
}

// /v1/completions: the prompt is text or token ids, sent as is (no chat template).
struct CompletionRequest {
  std::vector<int32_t> prompt;
  GenerationSettings generation;
  std::string model;
  bool stream = false, include_usage = false;
  int logprobs = -1;  // -1: none; else how many alternatives per token
};

CompletionRequest parse_completion_request(const ojson& j, const ModelInfo& info) {
  CompletionRequest r;
  r.model = adapter::opt_string(j, "model", "").value_or("");
  const ojson* prompt = adapter::field(j, "prompt");
  if (!prompt) throw adapter::bad_request("prompt", "prompt is required");
  // A list holding one prompt is the same as that prompt; several prompts per request are not served.
  const ojson* one = prompt;
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    one = &(*prompt)[0];
  if (one->is_string()) {
    if (!info.tokenizer)
      throw adapter::bad_request("prompt", "the served model has no tokenizer: send token ids");
    r.prompt = info.tokenizer->encode(one->get<std::string>(), /*add_special_tokens=*/true);
  } else if (one->is_array() && !one->empty() &&
             std::all_of(one->begin(), one->end(), [](const ojson& v) { return v.is_number_integer(); })) {
    const int64_t vocab = info.config ? info.config->vocab_size : INT32_MAX;
    for (size_t i = 0; i < one->size(); ++i) {
      const int64_t t = (*one)[i].get<int64_t>();
      if (t < 0 || t >= vocab)
        throw adapter::bad_request(adapter::index_path("prompt", i), "prompt token " + std::to_string(t) +
                                                                         " is outside the vocabulary [0, " +
                                                                         std::to_string(vocab) + ")");
      r.prompt.push_back(static_cast<int32_t>(t));
    }
  } else if (prompt->is_array() && prompt->size() > 1) {
    throw adapter::bad_request("prompt", "one prompt per request: send a string or a list of token ids");
  } else {
    throw adapter::bad_request("prompt", "prompt must be a string or a non-empty list of token ids");
  }
  if (r.prompt.empty()) throw adapter::bad_request("prompt", "prompt is empty");
  if (adapter::opt_bool(j, "echo", "").value_or(false))
    throw adapter::bad_request("echo", "echo is not supported");
  if (adapter::field(j, "suffix")) throw adapter::bad_request("suffix", "suffix is not supported");
  r.generation = info.defaults;
  adapter::read_sampling(j, r.generation.sampling);
  r.generation.max_tokens = 16;  // the API's default
  if (auto v = adapter::opt_integer(j, "max_tokens", "")) {
    if (*v < 1) throw adapter::bad_request("max_tokens", "max_tokens must be >= 1");
    r.generation.max_tokens = *v;
  }
  r.generation.stop = adapter::read_stop(j, "stop");
  if (auto v = adapter::opt_integer(j, "n", "")) {
    if (*v < 1 || *v > kMaxChoices)
      throw adapter::bad_request("n", "n must be in [1, " + std::to_string(kMaxChoices) + "]");
    r.generation.n = static_cast<int>(*v);
  }
  if (auto v = adapter::opt_integer(j, "logprobs", "")) {
    if (*v < 0 || *v > 20) throw adapter::bad_request("logprobs", "logprobs must be in [0, 20]");
    r.logprobs = static_cast<int>(*v);
    r.generation.logprobs = true;
    r.generation.top_logprobs = r.logprobs;
  }
  if (auto v = adapter::opt_bool(j, "ignore_eos", "")) r.generation.ignore_eos = *v;
  r.stream = adapter::opt_bool(j, "stream", "").value_or(false);
  if (const ojson* so = adapter::field(j, "stream_options"))
    r.include_usage = adapter::opt_bool(*so, "include_usage", "stream_options").value_or(false);
  return r;
}

ojson completion_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps, size_t text_offset) {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top = ojson::array(),
        offsets = ojson::array();
  for (const TokenLogprob& lp : lps) {
    const std::string text = tok ? adapter::token_text(*tok, lp.token) : std::to_string(lp.token);
    tokens.push_back(text);
    token_logprobs.push_back(lp.logprob);
    ojson alts = ojson::object();
    for (const auto& [t, l] : lp.top) alts[tok ? adapter::token_text(*tok, t) : std::to_string(t)] = l;
    top.push_back(std::move(alts));
    offsets.push_back(text_offset);
    text_offset += text.size();
  }
  return ojson{{"tokens", tokens},
               {"token_logprobs", token_logprobs},
               {"top_logprobs", top},
               {"text_offset", offsets}};
}

ApiResponse completions(std::string_view body, Backend& backend) {
  const ojson j = adapter::parse_body(body);
  const ModelInfo& info = backend.info();
  CompletionRequest request = parse_completion_request(j, info);
  SubmitRequest submit;
  submit.max_tokens =
      adapter::resolve_max_tokens(info, request.generation, static_cast<int64_t>(request.prompt.size()));
  submit.prompt = request.prompt;
  submit.settings = request.generation;
  submit.settings.max_tokens = submit.max_tokens;
  std::shared_ptr<GenerationStream> stream = backend.submit(std::move(submit));
  const std::string id = adapter::make_id("cmpl-");
  const int64_t created = adapter::unix_now();
  const std::string model = request.model.empty() ? info.served_name : request.model;
  const int n = request.generation.n;
  auto finish_name = [](llm::FinishReason f) { return f == llm::FinishReason::length ? "length" : "stop"; };
  if (request.stream) {
    ApiResponse r;
    r.content_type = "text/event-stream";
    const Tokenizer* tok = info.tokenizer;
    r.stream = [stream, request, id, created, model, n, tok, finish_name](StreamWriter& w) {
      auto chunk = [&](ojson choices) {
        ojson c{{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model},
                {"choices", std::move(choices)}};
        if (request.include_usage) c["usage"] = nullptr;
        return c;
      };
      std::vector<size_t> offsets(n, 0);
      int64_t completion_tokens = 0;
      try {
        GenerationDelta d;
        while (stream->next(d)) {
          if (d.index < 0 || d.index >= n) continue;
          completion_tokens += static_cast<int64_t>(d.tokens.size());
          ojson lp =
              request.logprobs >= 0 ? completion_logprobs(tok, d.logprobs, offsets[d.index]) : ojson(nullptr);
          offsets[d.index] += d.text.size();
          ojson finish = d.finish == llm::FinishReason::none ? ojson(nullptr) : ojson(finish_name(d.finish));
          if (d.text.empty() && finish.is_null() && lp.is_null()) continue;
          if (!w.write(sse(chunk(ojson::array({ojson{
                  {"index", d.index}, {"text", d.text}, {"logprobs", lp}, {"finish_reason", finish}}}))))) {
            stream->cancel();
            return;
          }
        }
      } catch (const std::exception& e) {
        w.write(sse(ojson{
            {"error",
             ojson{
                 {"message", e.what()}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}}));
        w.write("data: [DONE]\n\n");
        return;
      }
      if (request.include_usage) {
        ojson u = chunk(ojson::array());
        u["usage"] = usage_json(stream->prompt_tokens(), completion_tokens);
        if (!w.write(sse(u))) return;
      }
      w.write("data: [DONE]\n\n");
    };
    return r;
  }
  std::vector<std::string> text(n);
  std::vector<std::vector<TokenLogprob>> lps(n);
  std::vector<llm::FinishReason> finish(n, llm::FinishReason::stop);
  int64_t completion_tokens = 0;
  GenerationDelta d;
  while (stream->next(d)) {
    if (d.index < 0 || d.index >= n) continue;
    completion_tokens += static_cast<int64_t>(d.tokens.size());
    text[d.index] += d.text;
    lps[d.index].insert(lps[d.index].end(), d.logprobs.begin(), d.logprobs.end());
    if (d.finish != llm::FinishReason::none) finish[d.index] = d.finish;
  }
  ojson choices = ojson::array();
  for (int i = 0; i < n; ++i)
    choices.push_back(ojson{
        {"index", i},
        {"text", text[i]},
        {"logprobs", request.logprobs >= 0 ? completion_logprobs(info.tokenizer, lps[i], 0) : ojson(nullptr)},
        {"finish_reason", finish_name(finish[i])}});
  return json_response(ojson{{"id", id},
                             {"object", "text_completion"},
                             {"created", created},
                             {"model", model},
                             {"choices", std::move(choices)},
                             {"usage", usage_json(stream->prompt_tokens(), completion_tokens)}});
}

// Runs a handler, turning refusals into error responses; anything else unexpected is a 500 in the API's
// shape.
template <typename F>
ApiResponse guarded(F&& f) {
  try {
    return f();
  } catch (const ApiError& e) {
    return error_or_rethrow(e);
  } catch (const std::exception& e) {
    return openai_error(ApiError(500, "server_error", std::string("internal error: ") + e.what()));
  }
}

}  // namespace

ApiResponse openai_chat_completions(std::string_view body, Backend& backend) {
  return guarded([&] { return chat_completions(body, backend); });
}

ApiResponse openai_completions(std::string_view body, Backend& backend) {
  return guarded([&] { return completions(body, backend); });
}

ApiResponse openai_models(Backend& backend) {
  const ModelInfo& info = backend.info();
  return json_response(ojson{{"object", "list"},
                             {"data", ojson::array({ojson{{"id", info.served_name},
                                                          {"object", "model"},
                                                          {"created", info.created},
                                                          {"owned_by", "xmoe"},
                                                          {"max_model_len", info.max_seq_len}}})}});
}

ApiResponse openai_error(const ApiError& error) {
  ApiResponse r;
  r.status = error.status;
  std::string type = error.type;
  if (type.empty()) type = error.status >= 500 ? "server_error" : "invalid_request_error";
  ojson code = nullptr;
  if (error.status == 429) code = "rate_limit_exceeded";
  r.body = dump(ojson{{"error", ojson{{"message", error.what()},
                                      {"type", type},
                                      {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)},
                                      {"code", code}}}});
  return r;
}

}  // namespace xmoe::serve
