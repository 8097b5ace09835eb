// Anthropic Messages API: POST /v1/messages (JSON or the SSE event stream) and POST
// /v1/messages/count_tokens.
#include "serve/adapter_common.hpp"
#include "serve/anthropic_request.hpp"
#include "serve/api.hpp"

namespace xmoe::serve {

using adapter::dump;
using adapter::ojson;

namespace {

std::string event(const char* type, ojson data) {
  data["type"] = type;
  // "type" first, as Anthropic writes it.
  ojson ordered{{"type", type}};
  for (auto& [k, v] : data.items())
    if (k != "type") ordered[k] = v;
  return std::string("event: ") + type + "\ndata: " + dump(ordered) + "\n\n";
}

// Thinking blocks carry a signature that clients hand back unchanged; this server does not verify them, so
// it is a digest of the text (stable, opaque).
std::string thinking_signature(const std::string& thinking) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : thinking) h = (h ^ c) * 1099511628211ull;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "xmoe-";
  for (int i = 15; i >= 0; --i) s += kHex[(h >> (4 * i)) & 15];
  return s;
}

ojson tool_input(const std::string& arguments) {
  ojson j = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : ojson::object();
}

const char* stop_reason(const adapter::ChoiceOutput& c) {
  if (c.finish == llm::FinishReason::length) return "max_tokens";
  if (!c.tool_calls.empty()) return "tool_use";
  if (!c.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

ojson stop_sequence(const adapter::ChoiceOutput& c) {
  return c.stop_string.empty() || !c.tool_calls.empty() || c.finish == llm::FinishReason::length
             ? ojson(nullptr)
             : ojson(c.stop_string);
}

ojson usage_json(int64_t input, int64_t output) {
  return ojson{{"input_tokens", input},
               {"cache_creation_input_tokens", 0},
               {"cache_read_input_tokens", 0},
               {"output_tokens", output}};
}

const char* error_type(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

// The SSE stream of one message: content blocks opened and closed as the parser's events change kind.
struct MessageStream {
  std::unique_ptr<GenerationStream> stream;
  OutputParserOptions parser_options;
  OutputFormat format;
  std::string id, model;

  enum class Block { none, text, thinking, tool };

  void run(StreamWriter& w) {
    auto send = [&](const std::string& e) {
      if (w.write(e)) return true;
      stream->cancel();
      return false;
    };
    ojson message{{"id", id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", model},
                  {"content", ojson::array()},
                  {"stop_reason", nullptr},
                  {"stop_sequence", nullptr},
                  {"usage", usage_json(stream->prompt_tokens(), 0)}};
    if (!send(event("message_start", ojson{{"message", message}}))) return;
    if (!send(event("ping", ojson::object()))) return;

    std::unique_ptr<OutputParser> parser = make_output_parser(format, parser_options);
    adapter::ChoiceOutput out;
    Block open = Block::none;
    int index = -1;
    std::string thinking;  // the open thinking block's text, for its signature
    auto close = [&]() {
      if (open == Block::none) return true;
      if (open == Block::thinking &&
          !send(event("content_block_delta",
                      ojson{{"index", index},
                            {"delta", ojson{{"type", "signature_delta"},
                                            {"signature", thinking_signature(thinking)}}}})))
        return false;
      open = Block::none;
      return send(event("content_block_stop", ojson{{"index", index}}));
    };
    auto start = [&](Block kind, ojson block) {
      if (!close()) return false;
      open = kind;
      ++index;
      thinking.clear();
      return send(event("content_block_start", ojson{{"index", index}, {"content_block", std::move(block)}}));
    };
    auto delta = [&](ojson d) {
      return send(event("content_block_delta", ojson{{"index", index}, {"delta", std::move(d)}}));
    };

    try {
      GenerationDelta d;
      std::vector<OutputEvent> events;
      while (stream->next(d)) {
        if (d.index != 0) continue;
        out.tokens += static_cast<int64_t>(d.tokens.size());
        events.clear();
        parser->push(d.text, events);
        if (d.finish != llm::FinishReason::none) {
          parser->finish(events);
          out.finish = d.finish;
          out.stop_string = d.stop_string;
        }
        for (const OutputEvent& e : events) {
          bool ok = true;
          switch (e.kind) {
            case OutputEvent::Kind::text:
              if (open != Block::text) ok = start(Block::text, ojson{{"type", "text"}, {"text", ""}});
              ok = ok && delta(ojson{{"type", "text_delta"}, {"text", e.text}});
              break;
            case OutputEvent::Kind::thinking:
              if (open != Block::thinking)
                ok = start(Block::thinking, ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
              thinking += e.text;
              ok = ok && delta(ojson{{"type", "thinking_delta"}, {"thinking", e.text}});
              break;
            case OutputEvent::Kind::tool_call_begin: {
              adapter::apply_events({e}, out, "toolu_");
              const ToolCall& call = out.tool_calls.back();
              ok = start(Block::tool, ojson{{"type", "tool_use"},
                                            {"id", call.id},
                                            {"name", call.name},
                                            {"input", ojson::object()}});
              break;
            }
            case OutputEvent::Kind::tool_call_arguments:
              ok = delta(ojson{{"type", "input_json_delta"}, {"partial_json", e.text}});
              break;
            case OutputEvent::Kind::tool_call_end:
              ok = close();
              break;
          }
          if (!ok) return;
        }
      }
    } catch (const std::exception& e) {
      const ApiError* api = dynamic_cast<const ApiError*>(&e);
      const int status = api && (api->status == 429 || api->status == 529) ? 529 : 500;
      w.write(event("error", ojson{{"error", ojson{{"type", error_type(status)}, {"message", e.what()}}}}));
      return;
    }
    if (!close()) return;
    if (!send(event("message_delta", ojson{{"delta", ojson{{"stop_reason", stop_reason(out)},
                                                           {"stop_sequence", stop_sequence(out)}}},
                                           {"usage", ojson{{"output_tokens", out.tokens}}}})))
      return;
    w.write(event("message_stop", ojson::object()));
  }
};

ApiResponse messages(std::string_view body, Backend& backend) {
  const ojson j = adapter::parse_body(body);
  const ModelInfo& info = backend.info();
  ChatRequest request = parse_anthropic_request(j, info);
  adapter::PreparedChat p = adapter::prepare_chat(request, backend);
  std::unique_ptr<GenerationStream> stream;
  try {
    stream = backend.submit(std::move(p.submit));
  } catch (const ApiError& e) {
    if (e.status == 429) throw ApiError(529, "overloaded_error", e.what());
    throw;
  }
  const std::string id = adapter::make_id("msg_");
  const std::string model = request.model.empty() ? info.served_name : request.model;
  if (request.stream) {
    auto state = std::make_shared<MessageStream>(
        MessageStream{std::move(stream), std::move(p.parser), info.output_format, id, model});
    ApiResponse r;
    r.content_type = "text/event-stream";
    r.stream = [state](StreamWriter& w) { state->run(w); };
    return r;
  }
  const adapter::ChoiceOutput c = adapter::collect(*stream, 1, p.parser, info.output_format, "toolu_")[0];
  ojson content = ojson::array();
  if (!c.reasoning.empty())
    content.push_back(ojson{
        {"type", "thinking"}, {"thinking", c.reasoning}, {"signature", thinking_signature(c.reasoning)}});
  if (!c.text.empty()) content.push_back(ojson{{"type", "text"}, {"text", c.text}});
  for (const ToolCall& t : c.tool_calls)
    content.push_back(
        ojson{{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", tool_input(t.arguments)}});
  ApiResponse r;
  r.body = dump(ojson{{"id", id},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", model},
                      {"content", std::move(content)},
                      {"stop_reason", stop_reason(c)},
                      {"stop_sequence", stop_sequence(c)},
                      {"usage", usage_json(stream->prompt_tokens(), c.tokens)}});
  return r;
}

ApiResponse count_tokens(std::string_view body, Backend& backend) {
  const ojson j = adapter::parse_body(body);
  const ModelInfo& info = backend.info();
  ChatRequest request = parse_anthropic_request(j, info, /*for_count_tokens=*/true);
  request.generation.max_tokens = 1;
  if (!info.tokenizer || !info.chat)
    throw adapter::bad_request("messages", "the served model has no tokenizer and chat template");
  RenderedPrompt prompt;
  try {
    prompt = render_chat_prompt(*info.chat, request, info.chat_template.get());
  } catch (const std::exception& e) {
    throw adapter::bad_request("messages",
                               std::string("the chat template refused the conversation: ") + e.what());
  }
  const auto n = static_cast<int64_t>(info.tokenizer->encode(prompt.text, false).size());
  ApiResponse r;
  r.body = dump(ojson{{"input_tokens", n}});
  return r;
}

}  // namespace

ApiResponse anthropic_messages(std::string_view body, Backend& backend) {
  return adapter::guarded([&] { return messages(body, backend); }, anthropic_error, "api_error");
}

ApiResponse anthropic_count_tokens(std::string_view body, Backend& backend) {
  return adapter::guarded([&] { return count_tokens(body, backend); }, anthropic_error, "api_error");
}

ApiResponse anthropic_error(const ApiError& error) {
  ApiResponse r;
  r.status = error.status;
  r.body = dump(
      ojson{{"type", "error"}, {"error", ojson{{"type", error_type(r.status)}, {"message", error.what()}}}});
  return r;
}

}  // namespace xmoe::serve
