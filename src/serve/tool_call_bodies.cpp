#include "serve/tool_call_bodies.hpp"

#include <algorithm>

#include "serve/tagged_output_parser.hpp"

namespace xmoe::serve {

using ojson = nlohmann::ordered_json;

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

}  // namespace

std::string dump_json(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

size_t MarkerSearch::find(const std::string& text, std::string_view marker, size_t from) {
  const size_t at = text.find(marker, std::max(from, resume_));
  resume_ = at != std::string::npos || text.size() < marker.size() ? 0 : text.size() - marker.size() + 1;
  return at;
}

void emit_tool_call_begin(const std::string& name, int index, std::vector<OutputEvent>& out) {
  OutputEvent begin;
  begin.kind = OutputEvent::Kind::tool_call_begin;
  begin.tool_index = index;
  begin.tool_name = name;
  out.push_back(std::move(begin));
}

void JsonArgumentsStream::push(std::string_view text, int index, std::vector<OutputEvent>& out) {
  if (phase_ == Phase::start) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    if (text.front() == '{') {
      emit_tool_call_begin(name_, index, out);
      phase_ = Phase::streaming;
    } else {
      phase_ = Phase::whole;
    }
  }
  if (phase_ == Phase::whole) {
    whole_ += text;
  } else if (phase_ == Phase::streaming) {
    const size_t n = args_.push(text);
    append_event(out, OutputEvent::Kind::tool_call_arguments, text.substr(0, n), index);
    if (n < text.size()) phase_ = Phase::after;
  }
}

bool JsonArgumentsStream::end(int index, std::vector<OutputEvent>& out) {
  switch (phase_) {
    case Phase::start:
      return false;
    case Phase::streaming:
    case Phase::after:
      append_event(out, OutputEvent::Kind::tool_call_arguments, args_.completion(), index);
      append_event(out, OutputEvent::Kind::tool_call_end, "", index);
      return true;
    case Phase::whole:
      break;
  }
  ojson j = ojson::parse(whole_, nullptr, /*allow_exceptions=*/false);
  if (j.is_string()) j = ojson::parse(j.get<std::string>(), nullptr, false);
  if (!j.is_object()) return false;
  emit_tool_call_begin(name_, index, out);
  append_event(out, OutputEvent::Kind::tool_call_arguments, dump_json(j), index);
  append_event(out, OutputEvent::Kind::tool_call_end, "", index);
  return true;
}

void ArgumentObjectWriter::add(const std::string& key, const std::string& json_value, int index,
                               std::vector<OutputEvent>& out) {
  std::string fragment = count_++ == 0 ? "{" : ", ";
  fragment += dump_json(ojson(key)) + ": " + json_value;
  append_event(out, OutputEvent::Kind::tool_call_arguments, fragment, index);
}

void ArgumentObjectWriter::close(int index, std::vector<OutputEvent>& out) {
  append_event(out, OutputEvent::Kind::tool_call_arguments, count_ == 0 ? "{}" : "}", index);
}

const ojson* parameter_schema(const std::vector<ToolDefinition>& tools, std::string_view tool,
                              std::string_view param) {
  for (const ToolDefinition& t : tools) {
    if (t.name != tool) continue;
    const auto props = t.parameters.find("properties");
    if (props == t.parameters.end() || !props->is_object()) continue;
    const auto p = props->find(std::string(param));
    if (p != props->end()) return &*p;
  }
  return nullptr;
}

bool schema_allows_string(const ojson* schema) {
  if (!schema || !schema->is_object()) return false;
  const auto t = schema->find("type");
  if (t == schema->end()) return false;
  if (t->is_string()) return t->get<std::string>() == "string";
  if (t->is_array())
    for (const auto& e : *t)
      if (e.is_string() && e.get<std::string>() == "string") return true;
  return false;
}

std::string argument_value_json(const std::string& text, bool as_string) {
  if (!as_string) {
    const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return dump_json(j);
  }
  return dump_json(ojson(text));
}

}  // namespace xmoe::serve
