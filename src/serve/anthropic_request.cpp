#include "serve/anthropic_request.hpp"

#include <map>

#include "serve/adapter_common.hpp"

namespace xmoe::serve {

using adapter::bad_request;
using adapter::index_path;
using adapter::join_path;
using adapter::ojson;

namespace {

[[noreturn]] void unreadable_block(const std::string& path, const std::string& type) {
  throw bad_request(path, path + ": " + type + " content is not supported: this model reads text only");
}

bool is_media(const std::string& type) {
  return type == "image" || type == "document";
}

std::string block_type(const ojson& block, const std::string& path) {
  if (!block.is_object()) throw bad_request(path, path + " must be an object");
  const auto type = adapter::opt_string(block, "type", path);
  if (!type) throw bad_request(join_path(path, "type"), join_path(path, "type") + " is required");
  return *type;
}

std::string required_text(const ojson& block, const char* key, const std::string& path) {
  const auto t = adapter::opt_string(block, key, path);
  if (!t) throw bad_request(join_path(path, key), join_path(path, key) + " is required");
  return *t;
}

// A string, or text blocks joined (system prompts, tool results).
std::string text_of(const ojson& value, const std::string& path, const char* separator) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) throw bad_request(path, path + " must be a string or a list of content blocks");
  std::string text;
  bool first = true;
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string bpath = index_path(path, i);
    const std::string type = block_type(value[i], bpath);
    if (is_media(type)) unreadable_block(bpath, type);
    if (type != "text") continue;
    if (!first) text += separator;
    text += required_text(value[i], "text", bpath);
    first = false;
  }
  return text;
}

void read_user(const ojson& content, const std::string& path, const std::map<std::string, std::string>& names,
               std::vector<ChatMessage>& out) {
  ChatMessage user;
  user.role = Role::user;
  if (content.is_string()) {
    user.content = content.get<std::string>();
    out.push_back(std::move(user));
    return;
  }
  if (!content.is_array()) throw bad_request(path, path + " must be a string or a list of content blocks");
  bool has_text = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bpath = index_path(path, i);
    const std::string type = block_type(content[i], bpath);
    if (is_media(type)) unreadable_block(bpath, type);
    if (type == "text") {
      user.content += required_text(content[i], "text", bpath);
      has_text = true;
    } else if (type == "tool_result") {
      // Tool results become tool messages ahead of the user's own text, as the chat templates expect.
      ChatMessage tool;
      tool.role = Role::tool;
      tool.tool_call_id = required_text(content[i], "tool_use_id", bpath);
      if (const ojson* c = adapter::field(content[i], "content"))
        tool.content = text_of(*c, join_path(bpath, "content"), "\n");
      const auto it = names.find(tool.tool_call_id);
      if (it != names.end()) tool.tool_name = it->second;
      out.push_back(std::move(tool));
    }
    // Other block types (search results, container uploads, …) carry nothing this model reads.
  }
  if (has_text || out.empty() || out.back().role != Role::tool) out.push_back(std::move(user));
}

ChatMessage read_assistant(const ojson& content, const std::string& path) {
  ChatMessage m;
  m.role = Role::assistant;
  if (content.is_string()) {
    m.content = content.get<std::string>();
    return m;
  }
  if (!content.is_array()) throw bad_request(path, path + " must be a string or a list of content blocks");
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bpath = index_path(path, i);
    const ojson& b = content[i];
    const std::string type = block_type(b, bpath);
    if (is_media(type)) unreadable_block(bpath, type);
    if (type == "text") {
      m.content += required_text(b, "text", bpath);
    } else if (type == "thinking") {
      m.reasoning += required_text(b, "thinking", bpath);
    } else if (type == "tool_use") {
      ToolCall call;
      call.id = required_text(b, "id", bpath);
      call.name = required_text(b, "name", bpath);
      const ojson* input = adapter::field(b, "input");
      if (input && !input->is_object())
        throw bad_request(join_path(bpath, "input"), join_path(bpath, "input") + " must be an object");
      call.arguments = input ? adapter::dump(*input) : "{}";
      m.tool_calls.push_back(std::move(call));
    }
    // redacted_thinking holds nothing readable; server tool blocks are not ours.
  }
  return m;
}

void read_tools(const ojson& body, ChatRequest& r) {
  const ojson* t = adapter::field(body, "tools");
  if (!t) return;
  if (!t->is_array()) throw bad_request("tools", "tools must be a list");
  for (size_t i = 0; i < t->size(); ++i) {
    const std::string path = index_path("tools", i);
    const ojson& tool = (*t)[i];
    if (!tool.is_object()) throw bad_request(path, path + " must be an object");
    // Server tools (web_search_…, bash_…, text_editor_…) run on Anthropic's side: not offered to this model.
    const std::string type = adapter::opt_string(tool, "type", path).value_or("custom");
    if (type != "custom") continue;
    ToolDefinition def;
    def.name = required_text(tool, "name", path);
    def.description = adapter::opt_string(tool, "description", path).value_or("");
    def.parameters = adapter::read_schema(tool, "input_schema", path);
    r.tools.push_back(std::move(def));
  }
}

void read_tool_choice(const ojson& body, ChatRequest& r) {
  const ojson* c = adapter::field(body, "tool_choice");
  if (!c) return;
  if (!c->is_object()) throw bad_request("tool_choice", "tool_choice must be an object");
  const std::string type = adapter::opt_string(*c, "type", "tool_choice").value_or("auto");
  if (type == "auto") {
    r.tool_choice = ToolChoice::automatic;
  } else if (type == "none") {
    r.tool_choice = ToolChoice::none;
  } else if (type == "any") {
    if (r.tools.empty()) throw bad_request("tool_choice", "tool_choice 'any' needs tools");
    r.tool_choice = ToolChoice::required;
  } else if (type == "tool") {
    r.tool_choice = ToolChoice::named;
    r.tool_choice_name = required_text(*c, "name", "tool_choice");
    if (std::none_of(r.tools.begin(), r.tools.end(),
                     [&](const ToolDefinition& t) { return t.name == r.tool_choice_name; }))
      throw bad_request("tool_choice.name",
                        "tool_choice names tool '" + r.tool_choice_name + "', which is not in tools");
  } else {
    throw bad_request("tool_choice.type", "tool_choice.type must be auto, any, tool or none");
  }
}

void read_thinking(const ojson& body, ChatRequest& r) {
  // Anthropic's thinking is opt-in: without the field the template is asked for no thinking.
  r.enable_thinking = false;
  const ojson* t = adapter::field(body, "thinking");
  if (!t) return;
  if (!t->is_object()) throw bad_request("thinking", "thinking must be an object");
  const std::string type = adapter::opt_string(*t, "type", "thinking").value_or("");
  if (type == "enabled" || type == "adaptive") {
    r.enable_thinking = true;
    if (auto b = adapter::opt_integer(*t, "budget_tokens", "thinking")) {
      if (*b < 1) throw bad_request("thinking.budget_tokens", "thinking.budget_tokens must be >= 1");
      r.thinking_budget = *b;
    }
  } else if (type != "disabled") {
    throw bad_request("thinking.type", "thinking.type must be 'enabled' or 'disabled'");
  }
}

}  // namespace

ChatRequest parse_anthropic_request(const ojson& body, const ModelInfo& info, bool for_count_tokens) {
  ChatRequest r;
  r.generation = info.defaults;
  r.model = adapter::opt_string(body, "model", "").value_or("");
  if (const ojson* system = adapter::field(body, "system")) {
    ChatMessage m;
    m.role = Role::system;
    m.content = text_of(*system, "system", "\n");
    r.messages.push_back(std::move(m));
  }
  const ojson* messages = adapter::field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    throw bad_request("messages", "messages: a non-empty list is required");
  std::map<std::string, std::string> call_names;
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string path = index_path("messages", i);
    const ojson& m = (*messages)[i];
    if (!m.is_object()) throw bad_request(path, path + " must be an object");
    const auto role = adapter::opt_string(m, "role", path);
    const ojson* content = adapter::field(m, "content");
    if (!content) throw bad_request(join_path(path, "content"), join_path(path, "content") + " is required");
    if (role == "user") {
      read_user(*content, join_path(path, "content"), call_names, r.messages);
    } else if (role == "assistant") {
      r.messages.push_back(read_assistant(*content, join_path(path, "content")));
      for (const ToolCall& c : r.messages.back().tool_calls) call_names[c.id] = c.name;
    } else {
      throw bad_request(join_path(path, "role"), join_path(path, "role") + " must be 'user' or 'assistant'");
    }
  }
  if (auto v = adapter::opt_integer(body, "max_tokens", "")) {
    if (*v < 1) throw bad_request("max_tokens", "max_tokens must be >= 1");
    r.generation.max_tokens = *v;
  } else if (!for_count_tokens) {
    throw bad_request("max_tokens", "max_tokens: Field required");
  }
  adapter::read_sampling(body, r.generation.sampling);
  r.generation.stop = adapter::read_stop(body, "stop_sequences");
  r.stream = adapter::opt_bool(body, "stream", "").value_or(false);
  read_tools(body, r);
  read_tool_choice(body, r);
  read_thinking(body, r);
  return r;
}

}  // namespace xmoe::serve
