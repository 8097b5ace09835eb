// render_chat_prompt on OpenAI requests against Python jinja2 as transformers sets it up
// (tests/data/serve/chat_prompts.json, made by tools/make_serve_fixtures.py), plus the forced tool-call
// openings and the thinking detection.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "scripted_backend.hpp"
#include "serve/openai_request.hpp"

namespace xmoe::serve {
namespace {

using ojson = nlohmann::ordered_json;
using testing::read_text_file;

llm::ChatSetup setup_for(const std::string& template_file) {
  llm::ChatSetup s;
  s.chat_template = read_text_file(std::string(XMOE_TEST_DATA_DIR) + "/chat_templates/" + template_file);
  s.chat_template_origin = template_file;
  s.eos_token = "<|im_end|>";
  return s;
}

TEST(ChatPrompt, MatchesJinja2AsTransformersRendersIt) {
  const ojson fixture =
      ojson::parse(read_text_file(std::string(XMOE_TEST_DATA_DIR) + "/serve/chat_prompts.json"));
  ASSERT_GE(fixture["cases"].size(), 10u);
  for (const ojson& c : fixture["cases"]) {
    SCOPED_TRACE(c["template"].get<std::string>() + " / " + c["name"].get<std::string>());
    llm::ChatSetup setup = setup_for(c["template"]);
    setup.bos_token = fixture["bos_token"];
    setup.eos_token = fixture["eos_token"];
    ModelInfo info;
    const ChatRequest request = parse_openai_chat_request(c["request"], info);
    const RenderedPrompt p = render_chat_prompt(setup, request);
    EXPECT_EQ(p.text, c["expected"].get<std::string>());
    EXPECT_TRUE(p.forced_prefix.empty());
    EXPECT_FALSE(p.starts_in_thinking);
  }
}

ChatRequest weather_request(ToolChoice choice, int tools = 1) {
  ChatRequest r;
  r.messages.push_back(ChatMessage{Role::user, "Weather?", "", {}, "", ""});
  for (const char* name : {"get_weather", "get_time"}) {
    if (tools-- <= 0) break;
    ToolDefinition t;
    t.name = name;
    t.parameters = ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string"}}})");
    r.tools.push_back(t);
  }
  r.tool_choice = choice;
  if (choice == ToolChoice::named) r.tool_choice_name = "get_weather";
  return r;
}

TEST(ChatPrompt, ForcedToolCallOpenings) {
  const llm::ChatSetup qwen3 = setup_for("Qwen-Qwen3-0.6B.jinja");
  const llm::ChatSetup coder = setup_for("Qwen3-Coder.jinja");
  const std::string auto_text = render_chat_prompt(qwen3, weather_request(ToolChoice::automatic)).text;

  RenderedPrompt p = render_chat_prompt(qwen3, weather_request(ToolChoice::named));
  EXPECT_EQ(p.forced_prefix, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(p.text, auto_text + p.forced_prefix);
  p = render_chat_prompt(qwen3, weather_request(ToolChoice::required));  // one tool: that one
  EXPECT_EQ(p.forced_prefix, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  p = render_chat_prompt(qwen3, weather_request(ToolChoice::required, 2));
  EXPECT_EQ(p.forced_prefix, "<tool_call>\n{\"name\": \"");
  p = render_chat_prompt(coder, weather_request(ToolChoice::named));
  EXPECT_EQ(p.forced_prefix, "<tool_call>\n<function=get_weather>\n");
  p = render_chat_prompt(qwen3, weather_request(ToolChoice::none));
  EXPECT_TRUE(p.forced_prefix.empty());
  EXPECT_EQ(p.text.find("get_weather"), std::string::npos);
}

TEST(ChatPrompt, ThinkingOpenedByTheTemplate) {
  llm::ChatSetup s;
  s.chat_template = "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking %}{{ '<think>\\n' }}{% endif %}";
  ChatRequest r;
  r.messages.push_back(ChatMessage{Role::user, "x", "", {}, "", ""});
  r.enable_thinking = true;
  EXPECT_TRUE(render_chat_prompt(s, r).starts_in_thinking);
  r.enable_thinking = false;
  EXPECT_FALSE(render_chat_prompt(s, r).starts_in_thinking);
}

TEST(ChatPrompt, TemplateKwargsReachTheTemplateButCannotReplaceMessages) {
  llm::ChatSetup s;
  s.chat_template = "{{ custom }}|{{ messages | length }}|{{ add_generation_prompt }}";
  ChatRequest r;
  r.messages.push_back(ChatMessage{Role::user, "x", "", {}, "", ""});
  r.chat_template_kwargs = ojson{{"custom", "yes"}, {"messages", "hijack"}, {"add_generation_prompt", false}};
  EXPECT_EQ(render_chat_prompt(s, r).text, "yes|1|True");
}

}  // namespace
}  // namespace xmoe::serve
