#include "xmoe/chat_template.hpp"

#include <nlohmann/json.hpp>

#include "interpreter.hpp"
#include "parser.hpp"
#include "xmoe/error.hpp"

namespace xmoe {

ChatTemplate::ChatTemplate(std::shared_ptr<const jinja::Program> program) : program_(std::move(program)) {}

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& name) {
  return ChatTemplate(jinja::parse_program(source, name));
}

const std::string& ChatTemplate::name() const {
  return program_->name;
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  nlohmann::ordered_json ordered;
  try {
    ordered = nlohmann::ordered_json::parse(context.dump());
  } catch (const nlohmann::json::exception& e) {  // e.g. a string that is not UTF-8
    throw Error(detail::concat("chat template '", program_->name, "': bad context: ", e.what()));
  }
  return render_ordered(ordered);
}

std::string ChatTemplate::render_ordered(const nlohmann::ordered_json& context,
                                         const std::optional<std::tm>& now) const {
  XMOE_CHECK(context.is_object(), "chat template '", program_->name,
             "': the render context must be a JSON object, got ", context.type_name());
  jinja::Value values;
  try {
    values = jinja::from_json(context);
  } catch (const jinja::TemplateFailure& f) {
    throw Error(detail::concat("chat template '", program_->name, "': bad context: ", f.message));
  }
  return jinja::render_program(*program_, values, now);
}

}  // namespace xmoe
