#include "serve/openai_request.hpp"

#include <map>

#include "serve/adapter_common.hpp"

namespace xmoe::serve {

using adapter::bad_request;
using adapter::index_path;
using adapter::join_path;
using adapter::ojson;

namespace {

// Text of a content field: a string, or a list of parts of which only text is readable.
std::string content_text(const ojson& message, const std::string& path) {
  const ojson* c = adapter::field(message, "content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  const std::string cpath = join_path(path, "content");
  if (!c->is_array()) throw bad_request(cpath, cpath + " must be a string or a list of content parts");
  std::string text;
  for (size_t i = 0; i < c->size(); ++i) {
    const ojson& part = (*c)[i];
    const std::string ppath = index_path(cpath, i);
    if (!part.is_object()) throw bad_request(ppath, ppath + " must be an object");
    const std::string type = adapter::opt_string(part, "type", ppath).value_or("text");
    if (type == "text" || type == "input_text") {
      const auto t = adapter::opt_string(part, "text", ppath);
      if (!t) throw bad_request(join_path(ppath, "text"), join_path(ppath, "text") + " is required");
      text += *t;
    } else if (type == "image_url" || type == "input_image" || type == "input_audio" || type == "file" ||
               type == "video_url" || type == "audio_url") {
      throw bad_request(ppath, ppath + ": " + type + " content is not supported: this model reads text only");
    } else {
      throw bad_request(join_path(ppath, "type"),
                        join_path(ppath, "type") + ": unknown content part type '" + type + "'");
    }
  }
  return text;
}

std::string arguments_text(const ojson& fn, const std::string& path) {
  const ojson* a = adapter::field(fn, "arguments");
  if (!a) return "{}";
  if (a->is_string()) return a->get<std::string>();
  if (a->is_object()) return adapter::dump(*a);
  throw bad_request(join_path(path, "arguments"), join_path(path, "arguments") + " must be a string");
}

ChatMessage read_message(const ojson& m, const std::string& path,
                         const std::map<std::string, std::string>& names) {
  if (!m.is_object()) throw bad_request(path, path + " must be an object");
  const auto role = adapter::opt_string(m, "role", path);
  if (!role) throw bad_request(join_path(path, "role"), join_path(path, "role") + " is required");
  ChatMessage out;
  if (*role == "system" || *role == "developer") {
    out.role = Role::system;
  } else if (*role == "user") {
    out.role = Role::user;
  } else if (*role == "assistant") {
    out.role = Role::assistant;
  } else if (*role == "tool") {
    out.role = Role::tool;
  } else {
    throw bad_request(join_path(path, "role"), join_path(path, "role") + ": unknown role '" + *role +
                                                   "' (system, developer, user, assistant or tool)");
  }
  out.content = content_text(m, path);
  if (out.role == Role::assistant) {
    if (auto r = adapter::opt_string(m, "reasoning_content", path))
      out.reasoning = *r;
    else if (auto r2 = adapter::opt_string(m, "reasoning", path))
      out.reasoning = *r2;
    if (const ojson* calls = adapter::field(m, "tool_calls")) {
      const std::string cpath = join_path(path, "tool_calls");
      if (!calls->is_array()) throw bad_request(cpath, cpath + " must be a list");
      for (size_t i = 0; i < calls->size(); ++i) {
        const std::string ipath = index_path(cpath, i);
        const ojson& c = (*calls)[i];
        if (!c.is_object()) throw bad_request(ipath, ipath + " must be an object");
        const ojson* fn = adapter::field(c, "function");
        if (!fn || !fn->is_object())
          throw bad_request(join_path(ipath, "function"),
                            join_path(ipath, "function") + " must be an object");
        const std::string fpath = join_path(ipath, "function");
        const auto name = adapter::opt_string(*fn, "name", fpath);
        if (!name) throw bad_request(join_path(fpath, "name"), join_path(fpath, "name") + " is required");
        out.tool_calls.push_back(
            ToolCall{adapter::opt_string(c, "id", ipath).value_or(""), *name, arguments_text(*fn, fpath)});
      }
    }
  }
  if (out.role == Role::tool) {
    out.tool_call_id = adapter::opt_string(m, "tool_call_id", path).value_or("");
    out.tool_name = adapter::opt_string(m, "name", path).value_or("");
    if (out.tool_name.empty()) {
      const auto it = names.find(out.tool_call_id);
      if (it != names.end()) out.tool_name = it->second;
    }
  }
  return out;
}

std::vector<ToolDefinition> read_tools(const ojson& body) {
  std::vector<ToolDefinition> tools;
  const ojson* t = adapter::field(body, "tools");
  if (!t) return tools;
  if (!t->is_array()) throw bad_request("tools", "tools must be a list");
  for (size_t i = 0; i < t->size(); ++i) {
    const std::string path = index_path("tools", i);
    const ojson& tool = (*t)[i];
    if (!tool.is_object()) throw bad_request(path, path + " must be an object");
    const std::string type = adapter::opt_string(tool, "type", path).value_or("function");
    if (type != "function")
      throw bad_request(join_path(path, "type"), join_path(path, "type") + " must be 'function'");
    const ojson* fn = adapter::field(tool, "function");
    if (!fn || !fn->is_object())
      throw bad_request(join_path(path, "function"), join_path(path, "function") + " must be an object");
    const std::string fpath = join_path(path, "function");
    ToolDefinition def;
    const auto name = adapter::opt_string(*fn, "name", fpath);
    if (!name || name->empty())
      throw bad_request(join_path(fpath, "name"), join_path(fpath, "name") + " is required");
    def.name = *name;
    def.description = adapter::opt_string(*fn, "description", fpath).value_or("");
    def.parameters = adapter::read_schema(*fn, "parameters", fpath);
    tools.push_back(std::move(def));
  }
  return tools;
}

void read_tool_choice(const ojson& body, ChatRequest& r) {
  const ojson* c = adapter::field(body, "tool_choice");
  if (!c) return;
  if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "auto")
      r.tool_choice = ToolChoice::automatic;
    else if (s == "none")
      r.tool_choice = ToolChoice::none;
    else if (s == "required")
      r.tool_choice = ToolChoice::required;
    else
      throw bad_request("tool_choice", "tool_choice must be 'auto', 'none', 'required' or a named function");
  } else if (c->is_object()) {
    const ojson* fn = adapter::field(*c, "function");
    const auto name = fn ? adapter::opt_string(*fn, "name", "tool_choice.function") : std::nullopt;
    if (!name) throw bad_request("tool_choice.function.name", "tool_choice.function.name is required");
    r.tool_choice = ToolChoice::named;
    r.tool_choice_name = *name;
  } else {
    throw bad_request("tool_choice", "tool_choice must be a string or an object");
  }
  if (r.tool_choice == ToolChoice::required && r.tools.empty())
    throw bad_request("tool_choice", "tool_choice 'required' needs tools");
  if (r.tool_choice == ToolChoice::named &&
      std::none_of(r.tools.begin(), r.tools.end(),
                   [&](const ToolDefinition& t) { return t.name == r.tool_choice_name; }))
    throw bad_request("tool_choice",
                      "tool_choice names function '" + r.tool_choice_name + "', which is not in tools");
}

}  // namespace

ChatRequest parse_openai_chat_request(const ojson& body, const ModelInfo& info) {
  ChatRequest r;
  r.generation = info.defaults;
  r.model = adapter::opt_string(body, "model", "").value_or("");
  const ojson* messages = adapter::field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    throw bad_request("messages", "messages must be a non-empty list");
  std::map<std::string, std::string> call_names;  // tool_call id → function name, for tool messages
  for (size_t i = 0; i < messages->size(); ++i) {
    r.messages.push_back(read_message((*messages)[i], index_path("messages", i), call_names));
    for (const ToolCall& c : r.messages.back().tool_calls) call_names[c.id] = c.name;
  }
  adapter::read_sampling(body, r.generation.sampling);
  if (auto v = adapter::opt_integer(body, "max_tokens", "")) {
    if (*v < 1) throw bad_request("max_tokens", "max_tokens must be >= 1");
    r.generation.max_tokens = *v;
  }
  if (auto v = adapter::opt_integer(body, "max_completion_tokens", "")) {
    if (*v < 1) throw bad_request("max_completion_tokens", "max_completion_tokens must be >= 1");
    r.generation.max_tokens = *v;
  }
  r.generation.stop = adapter::read_stop(body, "stop");
  r.generation.n = adapter::read_choice_count(body);
  r.generation.logprobs = adapter::opt_bool(body, "logprobs", "").value_or(false);
  if (auto v = adapter::opt_integer(body, "top_logprobs", "")) {
    if (*v < 0 || *v > 20) throw bad_request("top_logprobs", "top_logprobs must be in [0, 20]");
    if (!r.generation.logprobs) throw bad_request("top_logprobs", "top_logprobs needs logprobs: true");
    r.generation.top_logprobs = static_cast<int>(*v);
  }
  if (auto v = adapter::opt_bool(body, "ignore_eos", "")) r.generation.ignore_eos = *v;
  r.stream = adapter::opt_bool(body, "stream", "").value_or(false);
  if (const ojson* so = adapter::field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("stream_options", "stream_options must be an object");
    r.include_usage = adapter::opt_bool(*so, "include_usage", "stream_options").value_or(false);
  }
  r.tools = read_tools(body);
  read_tool_choice(body, r);
  if (const ojson* rf = adapter::field(body, "response_format")) {
    if (!rf->is_object()) throw bad_request("response_format", "response_format must be an object");
    const std::string type = adapter::opt_string(*rf, "type", "response_format").value_or("text");
    // json_schema is served as json_object: the answer is one JSON object, the schema itself is not enforced.
    if (type == "json_object" || type == "json_schema")
      r.json_object = true;
    else if (type != "text")
      throw bad_request("response_format.type",
                        "response_format.type must be 'text', 'json_object' or 'json_schema'");
  }
  if (auto effort = adapter::opt_string(body, "reasoning_effort", "")) {
    if (*effort == "none" || *effort == "minimal")
      r.enable_thinking = false;
    else if (*effort == "low" || *effort == "medium" || *effort == "high")
      r.enable_thinking = true;
    else
      throw bad_request("reasoning_effort", "reasoning_effort must be none, minimal, low, medium or high");
  }
  if (const ojson* kw = adapter::field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw bad_request("chat_template_kwargs", "chat_template_kwargs must be an object");
    r.chat_template_kwargs = *kw;
    if (auto t = adapter::opt_bool(*kw, "enable_thinking", "chat_template_kwargs")) r.enable_thinking = *t;
  }
  // Templates that take the effort itself (gpt-oss's "Reasoning: low|medium|high") get it as a keyword too,
  // unless chat_template_kwargs sets one.
  if (auto effort = adapter::opt_string(body, "reasoning_effort", "");
      effort && r.enable_thinking.value_or(false) && !r.chat_template_kwargs.contains("reasoning_effort"))
    r.chat_template_kwargs["reasoning_effort"] = *effort;
  return r;
}

}  // namespace xmoe::serve
