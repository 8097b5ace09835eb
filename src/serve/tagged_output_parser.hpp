// The part of an output parser shared by the families that mark thinking with <think>…</think> and each tool
// call with an opening and a closing marker (Qwen3 and Qwen3-Coder <tool_call>…</tool_call>, DeepSeek
// <｜tool▁call▁begin｜>…, Kimi <|tool_call_begin|>…, GLM <tool_call>…): finding the markers as text streams
// in (a marker split across pushes is held back until decided) and trimming the whitespace the templates put
// around them. What lies between the call markers is the family's own format, read by a ToolCallBodyParser.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "serve/output_parser.hpp"

namespace xmoe::serve {

// Reads one tool call's body (the text between the markers) as it streams in.
class ToolCallBodyParser {
 public:
  virtual ~ToolCallBodyParser() = default;
  // The body grew by `text`: appends the events it settles (tool_call_begin once the name is known, then
  // argument fragments), all with tool_index `index`.
  virtual void push(std::string_view text, int index, std::vector<OutputEvent>& out) = 0;
  // The closing marker arrived (terminated = true) or the output ended inside the call (false). A call that
  // has begun is completed (arguments closed so that they parse) with tool_call_end, and true is returned;
  // false means the body was no call and nothing was emitted for it.
  virtual bool end(bool terminated, int index, std::vector<OutputEvent>& out) = 0;
};

using ToolCallBodyParserFactory = std::function<std::unique_ptr<ToolCallBodyParser>()>;

// A family's markers.
struct TaggedMarkup {
  std::string_view think_open = "<think>", think_close = "</think>";
  std::string_view call_open = "<tool_call>", call_close = "</tool_call>";
  // Markers that enclose a group of calls (DeepSeek's <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜>): they
  // carry nothing once each call has its own markers, so they are dropped like the space around a call.
  std::vector<std::string_view> call_group_markers;
};

class TaggedOutputParser final : public OutputParser {
 public:
  TaggedOutputParser(const OutputParserOptions& options, ToolCallBodyParserFactory make_body,
                     TaggedMarkup markup = {});
  void push(std::string_view text, std::vector<OutputEvent>& out) override;
  void finish(std::vector<OutputEvent>& out) override;

 private:
  enum class State { text, thinking, tool };
  void process(std::vector<OutputEvent>& out);
  void emit_prose(std::string_view text, std::vector<OutputEvent>& out);
  void give_back_call(std::vector<OutputEvent>& out);
  void enter(State state);

  OutputParserOptions options_;
  ToolCallBodyParserFactory make_body_;
  TaggedMarkup markup_;
  State state_ = State::text;
  std::string pending_;         // text not yet decided (may begin a marker)
  std::string held_space_;      // trailing whitespace of text/thinking, dropped if a marker follows
  bool at_block_start_ = true;  // leading whitespace of a text/thinking stretch is dropped
  std::unique_ptr<ToolCallBodyParser> body_;
  std::string raw_call_;  // the call's text as written, given back as text when it is no call
  int tool_index_ = 0;
  std::vector<OutputEvent> prefix_events_;  // what the forced prefix produced, delivered with the first push
};

// Holds back the longest tail of `text` that is a proper prefix of one of `markers`.
size_t undecided_tail(std::string_view text, const std::vector<std::string_view>& markers);

void append_event(std::vector<OutputEvent>& out, OutputEvent::Kind kind, std::string_view text, int index);

}  // namespace xmoe::serve
