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
    // The server parses the template once per model and renders every request with it.
    const auto parsed = parse_chat_template(setup);
    ASSERT_TRUE(parsed);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(render_chat_prompt(setup, request, parsed.get()).text, p.text);
  }
}

TEST(ChatPrompt, TemplateThatDoesNotParseFailsEachRequest) {
  llm::ChatSetup s;
  s.chat_template = "{% for m in messages %}{{ m.content }}";
  s.chat_template_origin = "broken.jinja";
  EXPECT_EQ(parse_chat_template(s), nullptr);
  EXPECT_EQ(parse_chat_template(llm::ChatSetup{}), nullptr);
  ChatRequest r;
  r.messages.push_back(ChatMessage{Role::user, "x", "", {}, "", ""});
  try {
    render_chat_prompt(s, r);
    ADD_FAILURE() << "expected the parse error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.jinja"), std::string::npos) << e.what();
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

// The forced opening of each newer family, and the parser reading the model's continuation after it: the
// call comes out whole, whether the prompt left the model inside <think> or not.
TEST(ChatPrompt, ForcedToolCallOpeningsOfDeepseekKimiGlm) {
  struct Case {
    const char* file;
    bool thinking;
    const char* prefix;
    const char* continuation;
  };
  const Case cases[] = {
      {"deepseek-ai-DeepSeek-V3.1.jinja", true,
       "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>",
       "{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"deepseek-ai-DeepSeek-V3.1.jinja", false,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>",
       "{\"city\": \"Oslo\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"deepseek-ai-DeepSeek-V3.2.jinja", true,
       "</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n",
       "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
       "</｜DSML｜function_calls>"},
      {"Kimi-K2-Instruct.jinja", false,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>",
       "{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>"},
      {"GLM-4.6.jinja", true, "\n<think></think>\n<tool_call>get_weather",
       "\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"},
      {"GLM-4.6.jinja", false, "\n<tool_call>get_weather",
       "\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"},
      {"GLM-4.7-Flash.jinja", true, "</think><tool_call>get_weather",
       "<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + (c.thinking ? " thinking" : ""));
    const llm::ChatSetup setup = setup_for(c.file);
    ChatRequest r = weather_request(ToolChoice::named);
    r.enable_thinking = c.thinking;
    const RenderedPrompt p = render_chat_prompt(setup, r);
    EXPECT_EQ(p.forced_prefix, c.prefix);
    EXPECT_TRUE(p.text.ends_with(p.forced_prefix));
    OutputParserOptions o;
    o.starts_in_thinking = p.starts_in_thinking;
    o.forced_prefix = p.forced_prefix;
    o.tools = r.tools;
    const auto parser = make_output_parser(output_format_of_template(setup), o);
    std::vector<OutputEvent> events;
    parser->push(c.continuation, events);
    parser->finish(events);
    std::string args, name, other;
    for (const OutputEvent& e : events) {
      if (e.kind == OutputEvent::Kind::tool_call_begin) name += e.tool_name;
      if (e.kind == OutputEvent::Kind::tool_call_arguments) args += e.text;
      if (e.kind == OutputEvent::Kind::text || e.kind == OutputEvent::Kind::thinking) other += e.text;
    }
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(ojson::parse(args), ojson::parse(R"({"city": "Oslo"})"));
    EXPECT_EQ(other, "");
  }
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
