// gpt-oss's harmony format. The prompt ends with "<|start|>assistant"; the model then writes messages
//   <|channel|>analysis<|message|>…<|end|>
//   <|start|>assistant<|channel|>final<|message|>…<|return|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
// (the recipient may also stand in the header before <|channel|>: "assistant to=functions.NAME<|channel|>…").
// analysis → thinking, final and commentary without a recipient → text, a message to a recipient → a tool
// call whose arguments are the message (the "functions." namespace dropped from the name). <|return|> and
// <|call|> are end-of-sequence tokens, so the output usually just ends where they would stand.
// The markers are special tokens: the engine's text stream must keep them (skip_special_tokens off).
#include <string>

#include "serve/json_prefix.hpp"
#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"

namespace xmoe::serve {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kCall = "<|call|>";

struct Header {
  std::string channel, recipient;
};

// The word after `key` in the header, up to whitespace or the next marker.
std::string word_after(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return "";
  size_t b = at + key.size();
  while (b < header.size() && header[b] == ' ') ++b;
  size_t e = b;
  while (e < header.size() && header[e] != ' ' && header[e] != '<' && header[e] != '\n') ++e;
  return std::string(header.substr(b, e - b));
}

Header parse_header(std::string_view header) {
  Header h;
  h.channel = word_after(header, kChannel);
  h.recipient = word_after(header, "to=");
  return h;
}

class HarmonyOutputParser final : public OutputParser {
 public:
  explicit HarmonyOutputParser(const OutputParserOptions& options) : options_(options) {
    if (!options_.forced_prefix.empty()) push(options_.forced_prefix, prefix_events_);
  }

  void push(std::string_view text, std::vector<OutputEvent>& out) override {
    if (!prefix_events_.empty()) {
      out.insert(out.end(), prefix_events_.begin(), prefix_events_.end());
      prefix_events_.clear();
    }
    pending_ += text;
    process(out);
  }

  void finish(std::vector<OutputEvent>& out) override {
    if (state_ == State::header) {
      // A header that never reached <|message|> is not markup we understand: give it back as text.
      append_event(out, OutputEvent::Kind::text, header_, 0);
    } else {
      emit(pending_, out);
      if (state_ == State::body) close_message(/*terminated=*/false, out);
    }
    pending_.clear();
    header_.clear();
  }

 private:
  enum class State { header, body, between };
  enum class Body { text, thinking, tool };

  void process(std::vector<OutputEvent>& out) {
    while (!pending_.empty()) {
      if (state_ == State::header) {
        header_ += pending_;
        pending_.clear();
        const size_t at = header_.find(kMessage);
        if (at == std::string::npos) return;
        pending_ = header_.substr(at + kMessage.size());
        header_.resize(at);
        open_message(parse_header(header_), out);
        header_.clear();
        continue;
      }
      // Body or between messages: text up to the next marker.
      static const std::vector<std::string_view> markers = {kStart, kChannel, kEnd, kReturn, kCall};
      size_t at = std::string::npos;
      std::string_view found;
      for (std::string_view m : markers) {
        const size_t p = pending_.find(m);
        if (p < at) {
          at = p;
          found = m;
        }
      }
      if (at == std::string::npos) {
        const size_t hold = undecided_tail(pending_, markers);
        emit(std::string_view(pending_).substr(0, pending_.size() - hold), out);
        pending_.erase(0, pending_.size() - hold);
        return;
      }
      emit(std::string_view(pending_).substr(0, at), out);
      if (state_ == State::body)
        close_message(/*terminated=*/found == kCall || found == kEnd || found == kReturn, out);
      if (found == kStart) {
        state_ = State::header;
        pending_.erase(0, at + found.size());
      } else if (found == kChannel) {
        state_ = State::header;  // a header without <|start|>role: the channel marker starts it
        pending_.erase(0, at);
      } else {
        state_ = State::between;
        pending_.erase(0, at + found.size());
      }
    }
  }

  void open_message(const Header& h, std::vector<OutputEvent>& out) {
    state_ = State::body;
    if (!h.recipient.empty() && options_.parse_tools) {
      body_ = Body::tool;
      std::string name = h.recipient;
      if (name.starts_with("functions.")) name.erase(0, 10);
      OutputEvent begin;
      begin.kind = OutputEvent::Kind::tool_call_begin;
      begin.tool_name = name;
      begin.tool_index = tool_index_;
      out.push_back(std::move(begin));
      args_ = JsonPrefix();
      args_valid_ = true;
    } else if (h.channel == "analysis" && options_.parse_thinking) {
      body_ = Body::thinking;
    } else {
      body_ = Body::text;
    }
  }

  // Message content (or stray text between messages, which is shown as text).
  void emit(std::string_view text, std::vector<OutputEvent>& out) {
    if (text.empty()) return;
    if (state_ != State::body || body_ == Body::text) {
      append_event(out, OutputEvent::Kind::text, text, 0);
    } else if (body_ == Body::thinking) {
      append_event(out, OutputEvent::Kind::thinking, text, 0);
    } else {
      if (args_valid_) args_valid_ = args_.push(text) == text.size();
      append_event(out, OutputEvent::Kind::tool_call_arguments, text, tool_index_);
    }
  }

  void close_message(bool terminated, std::vector<OutputEvent>& out) {
    if (body_ == Body::tool) {
      // Cut off by the token budget: close the arguments so that they parse.
      if (!terminated && args_valid_ && args_.started() && !args_.complete())
        append_event(out, OutputEvent::Kind::tool_call_arguments, args_.completion(), tool_index_);
      append_event(out, OutputEvent::Kind::tool_call_end, "", tool_index_);
      ++tool_index_;
    }
    state_ = State::between;
    body_ = Body::text;
  }

  OutputParserOptions options_;
  State state_ = State::header;
  Body body_ = Body::text;
  std::string pending_, header_;
  JsonPrefix args_;
  bool args_valid_ = true;
  int tool_index_ = 0;
  std::vector<OutputEvent> prefix_events_;
};

}  // namespace

std::unique_ptr<OutputParser> make_harmony_output_parser(const OutputParserOptions& options) {
  return std::make_unique<HarmonyOutputParser>(options);
}

}  // namespace xmoe::serve
