// Chat templates: an in-house subset of Jinja that renders the chat templates published with MoE LLMs exactly
// as Python jinja2 does when transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, tojson without HTML escaping, raise_exception and strftime_now globals).
#pragma once
#include <ctime>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

namespace xmoe {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses the template; unsupported syntax → xmoe::Error naming `name`, the line (and column) and the
  // construct.
  static ChatTemplate parse(const std::string& source, const std::string& name);

  // Renders with `context` (messages, tools, add_generation_prompt, enable_thinking, bos_token, eos_token,
  // ... any JSON object) plus the host functions raise_exception(msg) (→ xmoe::Error with the message) and
  // strftime_now(fmt). Runtime errors name the template and line. nlohmann::json keeps object keys sorted, so
  // the template sees them in alphabetical order; use render_ordered to keep the caller's key order (Python
  // dicts keep insertion order, which shows in tojson output of tool schemas).
  std::string render(const nlohmann::json& context) const;

  // As render, keeping object key order. `now` pins what strftime_now formats (local time when absent).
  std::string render_ordered(const nlohmann::ordered_json& context,
                             const std::optional<std::tm>& now = std::nullopt) const;

  const std::string& name() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program);
  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace xmoe
