#include "serve/tagged_output_parser.hpp"

#include <algorithm>

namespace xmoe::serve {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

}  // namespace

size_t undecided_tail(std::string_view text, const std::vector<std::string_view>& markers) {
  size_t best = 0;
  for (std::string_view m : markers) {
    for (size_t len = std::min(m.size() - 1, text.size()); len > best; --len) {
      if (text.substr(text.size() - len) == m.substr(0, len)) {
        best = len;
        break;
      }
    }
  }
  return best;
}

void append_event(std::vector<OutputEvent>& out, OutputEvent::Kind kind, std::string_view text, int index) {
  if (text.empty() && (kind == OutputEvent::Kind::text || kind == OutputEvent::Kind::thinking ||
                       kind == OutputEvent::Kind::tool_call_arguments))
    return;
  OutputEvent e;
  e.kind = kind;
  e.text = std::string(text);
  e.tool_index = index;
  out.push_back(std::move(e));
}

TaggedOutputParser::TaggedOutputParser(const OutputParserOptions& options,
                                       ToolCallBodyParserFactory make_body, TaggedMarkup markup)
    : options_(options), make_body_(std::move(make_body)), markup_(std::move(markup)) {
  if (options_.starts_in_thinking && options_.parse_thinking) state_ = State::thinking;
  if (!options_.forced_prefix.empty()) push(options_.forced_prefix, prefix_events_);
}

void TaggedOutputParser::enter(State state) {
  state_ = state;
  at_block_start_ = true;
  held_space_.clear();
}

void TaggedOutputParser::emit_prose(std::string_view text, std::vector<OutputEvent>& out) {
  const auto kind = state_ == State::thinking ? OutputEvent::Kind::thinking : OutputEvent::Kind::text;
  if (at_block_start_) {
    size_t skip = 0;
    while (skip < text.size() && is_space(text[skip])) ++skip;
    text.remove_prefix(skip);
    if (text.empty()) return;
    at_block_start_ = false;
  }
  size_t body_end = text.size();
  while (body_end > 0 && is_space(text[body_end - 1])) --body_end;
  if (body_end > 0) {
    held_space_ += text.substr(0, body_end);
    append_event(out, kind, held_space_, 0);
    held_space_.clear();
  }
  held_space_ += text.substr(body_end);
}

void TaggedOutputParser::push(std::string_view text, std::vector<OutputEvent>& out) {
  if (!prefix_events_.empty()) {
    out.insert(out.end(), prefix_events_.begin(), prefix_events_.end());
    prefix_events_.clear();
  }
  pending_ += text;
  process(out);
}

void TaggedOutputParser::process(std::vector<OutputEvent>& out) {
  for (;;) {
    std::vector<std::string_view> markers;
    if (state_ == State::text) {
      if (options_.parse_thinking) markers.push_back(markup_.think_open);
      if (options_.parse_tools) {
        markers.push_back(markup_.call_open);
        markers.insert(markers.end(), markup_.call_group_markers.begin(), markup_.call_group_markers.end());
      }
    } else {
      markers.push_back(state_ == State::thinking ? markup_.think_close : markup_.call_close);
    }
    size_t at = std::string::npos, len = 0;
    for (std::string_view m : markers) {
      const size_t p = pending_.find(m);
      if (p < at) at = p, len = m.size();
    }
    const bool found = at != std::string::npos;
    const size_t decided = found ? at : pending_.size() - undecided_tail(pending_, markers);
    const std::string_view content = std::string_view(pending_).substr(0, decided);
    if (state_ == State::tool) {
      raw_call_ += content;
      body_->push(content, tool_index_, out);
    } else {
      emit_prose(content, out);
    }
    if (!found) {
      pending_.erase(0, decided);
      return;
    }
    const std::string marker = pending_.substr(at, len);
    pending_.erase(0, at + len);
    if (state_ == State::tool) {
      const bool was_call = body_->end(/*terminated=*/true, tool_index_, out);
      body_.reset();
      enter(State::text);
      if (was_call) {
        ++tool_index_;
      } else {
        raw_call_ += marker;
        give_back_call(out);
      }
    } else if (state_ == State::thinking) {
      enter(State::text);
    } else if (marker == markup_.think_open) {
      enter(State::thinking);
    } else if (marker != markup_.call_open) {
      enter(State::text);  // a call-group marker
    } else {
      // The space before a call is dropped, unless the call turns out to be text.
      raw_call_ = held_space_ + marker;
      enter(State::tool);
      body_ = make_body_();
    }
  }
}

void TaggedOutputParser::finish(std::vector<OutputEvent>& out) {
  if (!prefix_events_.empty()) {
    out.insert(out.end(), prefix_events_.begin(), prefix_events_.end());
    prefix_events_.clear();
  }
  const std::string rest = std::move(pending_);
  pending_.clear();
  if (state_ == State::tool) {
    raw_call_ += rest;
    body_->push(rest, tool_index_, out);
    const bool was_call = body_->end(/*terminated=*/false, tool_index_, out);
    body_.reset();
    enter(State::text);
    if (was_call)
      ++tool_index_;
    else
      give_back_call(out);
    return;
  }
  emit_prose(rest, out);
  held_space_.clear();
}

void TaggedOutputParser::give_back_call(std::vector<OutputEvent>& out) {
  // Not a call: its text, as written, is answer text.
  append_event(out, OutputEvent::Kind::text, raw_call_, 0);
  at_block_start_ = false;
  raw_call_.clear();
}

}  // namespace xmoe::serve
