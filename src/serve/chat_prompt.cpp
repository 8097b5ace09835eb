#include <algorithm>
#include <nlohmann/json.hpp>

#include "serve/chat_request.hpp"
#include "serve/output_parser.hpp"
#include "xmoe/chat_template.hpp"
#include "xmoe/error.hpp"

namespace xmoe::serve {

namespace {

using ojson = nlohmann::ordered_json;

const char* role_name(Role r) {
  switch (r) {
    case Role::system:
      return "system";
    case Role::user:
      return "user";
    case Role::assistant:
      return "assistant";
    case Role::tool:
      return "tool";
  }
  return "user";
}

// HF's convention: templates receive arguments as an object (they tojson it or iterate its items); text that
// is not a JSON object is passed on as the string it is.
ojson arguments_value(const std::string& arguments) {
  ojson j = ojson::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) return j;
  return ojson(arguments);
}

ojson message_json(const ChatMessage& m) {
  ojson j{{"role", role_name(m.role)}, {"content", m.content}};
  if (m.role == Role::assistant) {
    if (!m.reasoning.empty()) j["reasoning_content"] = m.reasoning;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ToolCall& c : m.tool_calls)
        calls.push_back(
            ojson{{"type", "function"},
                  {"id", c.id},
                  {"function", ojson{{"name", c.name}, {"arguments", arguments_value(c.arguments)}}}});
      j["tool_calls"] = std::move(calls);
    }
  }
  if (m.role == Role::tool) {
    j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_name.empty()) j["name"] = m.tool_name;
  }
  return j;
}

bool tools_offered(const ChatRequest& r) {
  return !r.tools.empty() && r.tool_choice != ToolChoice::none;
}

std::string quoted(const std::string& s) {
  return ojson(s).dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string_view without_trailing_space(std::string_view text) {
  while (!text.empty() && std::string_view(" \t\r\n").find(text.back()) != std::string_view::npos)
    text.remove_suffix(1);
  return text;
}

}  // namespace

std::vector<std::string> forced_tool_names(const ChatRequest& request) {
  std::vector<std::string> names;
  if (request.tool_choice == ToolChoice::named) {
    names.push_back(request.tool_choice_name);
  } else if (request.tool_choice == ToolChoice::required) {
    for (const ToolDefinition& t : request.tools) names.push_back(t.name);
  }
  return names;
}

std::string forced_tool_prefix(OutputFormat format, const ChatRequest& request) {
  const std::vector<std::string> names = forced_tool_names(request);
  if (names.empty()) return "";
  const bool one = names.size() == 1;
  switch (format) {
    case OutputFormat::qwen3:
      if (one) return "<tool_call>\n{\"name\": " + quoted(names[0]) + ", \"arguments\": ";
      return "<tool_call>\n{\"name\": \"";
    case OutputFormat::qwen3_coder:
      if (one) return "<tool_call>\n<function=" + names[0] + ">\n";
      return "<tool_call>\n<function=";
    case OutputFormat::harmony:
      if (one) return "<|channel|>commentary to=functions." + names[0] + " <|constrain|>json<|message|>";
      return "<|channel|>commentary to=functions.";
    case OutputFormat::deepseek_v3:
      return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + (one ? names[0] + "<｜tool▁sep｜>" : "");
    case OutputFormat::deepseek_v32:
      return "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"" + (one ? names[0] + "\">\n" : "");
    case OutputFormat::kimi_k2: {
      if (!one) return "<|tool_calls_section_begin|><|tool_call_begin|>functions.";
      // Kimi's template numbers every call of the conversation; the forced one is the next.
      size_t calls = 0;
      for (const ChatMessage& m : request.messages) calls += m.tool_calls.size();
      return "<|tool_calls_section_begin|><|tool_call_begin|>functions." + names[0] + ":" +
             std::to_string(calls) + "<|tool_call_argument_begin|>";
    }
    case OutputFormat::glm4:
      return "<tool_call>" + (one ? names[0] : "");
    case OutputFormat::plain:
      break;
  }
  return "";
}

bool prompt_opens_thinking(std::string_view prompt) {
  return without_trailing_space(prompt).ends_with("<think>");
}

std::shared_ptr<const ChatTemplate> parse_chat_template(const llm::ChatSetup& setup) {
  if (!setup.chat_template) return nullptr;
  try {
    return std::make_shared<const ChatTemplate>(
        ChatTemplate::parse(*setup.chat_template, setup.chat_template_origin));
  } catch (const Error&) {
    return nullptr;
  }
}

RenderedPrompt render_chat_prompt(const llm::ChatSetup& setup, const ChatRequest& request,
                                  const ChatTemplate* parsed) {
  XMOE_CHECK(
      setup.chat_template.has_value(),
      "the model has no chat template (tokenizer_config.json \"chat_template\" or chat_template.jinja)");
  ojson messages = ojson::array();
  for (const ChatMessage& m : request.messages) messages.push_back(message_json(m));
  ojson context = ojson::object();
  // Template keyword arguments first, so that they cannot replace the conversation itself.
  for (const auto& [key, value] : request.chat_template_kwargs.items()) context[key] = value;
  context["messages"] = std::move(messages);
  // Tools are not shown for tool_choice "none": the parser would not read a call, so none is invited
  // (vLLM's --exclude-tools-when-tool-choice-none behaviour).
  if (tools_offered(request)) {
    ojson tools = ojson::array();
    for (const ToolDefinition& t : request.tools) {
      ojson fn{{"name", t.name}};
      if (!t.description.empty()) fn["description"] = t.description;
      fn["parameters"] = t.parameters;
      tools.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
    }
    context["tools"] = std::move(tools);
  } else {
    context["tools"] = nullptr;
  }
  context["add_generation_prompt"] = true;
  if (request.enable_thinking) context["enable_thinking"] = *request.enable_thinking;
  context["bos_token"] = setup.bos_token;
  context["eos_token"] = setup.eos_token;

  RenderedPrompt out;
  if (parsed) {
    out.text = parsed->render_ordered(context);
  } else {
    out.text = ChatTemplate::parse(*setup.chat_template, setup.chat_template_origin).render_ordered(context);
  }
  const std::string_view trimmed = without_trailing_space(out.text);
  out.starts_in_thinking = prompt_opens_thinking(out.text);
  if (tools_offered(request)) {
    const OutputFormat format = output_format_of_template(setup);
    out.forced_prefix = forced_tool_prefix(format, request);
    if (!out.forced_prefix.empty()) {
      if (format == OutputFormat::glm4 && trimmed.ends_with("<|assistant|>")) {
        // GLM-4.5/4.6 answer with a thinking block first; a forced call skips it as their template writes.
        out.forced_prefix = "\n<think></think>\n" + out.forced_prefix;
      } else if (format == OutputFormat::glm4 && trimmed.ends_with("<think></think>")) {
        out.forced_prefix = "\n" + out.forced_prefix;  // GLM-4.5/4.6 with thinking off
      } else if (out.starts_in_thinking && format != OutputFormat::qwen3 &&
                 format != OutputFormat::qwen3_coder) {
        // The prompt opened thinking (DeepSeek, GLM-4.7): close it before the call; the parser reads the
        // close as the end of an empty thinking block.
        out.forced_prefix = "</think>" + out.forced_prefix;
      } else {
        out.starts_in_thinking = false;
      }
    }
  }
  out.text += out.forced_prefix;
  return out;
}

}  // namespace xmoe::serve
