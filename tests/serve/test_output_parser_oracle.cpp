// The DeepSeek, Kimi and GLM output parsers against their own chat templates:
// tools/make_output_parser_fixtures.py has each real template (Python jinja2) write an assistant turn with
// reasoning, content and tool calls; the text after the generation prompt is what the model would have
// produced. Fed to the parser the template selects, whole, byte by byte and in random chunks (splitting
// markers and UTF-8 characters), it must give back the same reasoning, content, tool names and arguments (as
// JSON). Every prefix of it (output cut off anywhere) must parse without error into well-formed events.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "serve/output_parser.hpp"

namespace xmoe::serve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using Kind = OutputEvent::Kind;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const ojson& fixture() {
  static const ojson f =
      ojson::parse(read_file(fs::path(XMOE_TEST_DATA_DIR) / "serve" / "output_parser_oracle.json"));
  return f;
}

std::vector<ToolDefinition> offered_tools() {
  std::vector<ToolDefinition> tools;
  for (const auto& t : fixture().at("tools")) {
    ToolDefinition d;
    d.name = t.at("function").at("name").get<std::string>();
    d.parameters = t.at("function").at("parameters");
    tools.push_back(std::move(d));
  }
  return tools;
}

OutputFormat format_of(const std::string& template_file) {
  llm::ChatSetup setup;
  setup.chat_template = read_file(fs::path(XMOE_TEST_DATA_DIR) / "chat_templates" / template_file);
  return output_format_of_template(setup);
}

struct Parsed {
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments text
  bool complete = true;                                    // every begun call ended
};

// Runs the parser over `pieces` and checks the event stream's shape: calls numbered 0, 1, … in order,
// arguments only inside a call, every ended call's arguments one JSON object.
Parsed run(OutputFormat format, const OutputParserOptions& options,
           const std::vector<std::string_view>& pieces) {
  const auto parser = make_output_parser(format, options);
  std::vector<OutputEvent> events;
  for (std::string_view p : pieces) parser->push(p, events);
  parser->finish(events);
  Parsed out;
  bool in_call = false;
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case Kind::text:
        out.content += e.text;
        break;
      case Kind::thinking:
        out.reasoning += e.text;
        break;
      case Kind::tool_call_begin:
        EXPECT_FALSE(in_call) << "a call began inside a call";
        EXPECT_EQ(e.tool_index, static_cast<int>(out.calls.size()));
        out.calls.emplace_back(e.tool_name, "");
        in_call = true;
        break;
      case Kind::tool_call_arguments:
        EXPECT_TRUE(in_call) << "arguments outside a call";
        if (!out.calls.empty()) out.calls.back().second += e.text;
        break;
      case Kind::tool_call_end: {
        EXPECT_TRUE(in_call);
        in_call = false;
        const std::string args = out.calls.empty() ? "" : out.calls.back().second;
        EXPECT_TRUE(ojson::parse(args, nullptr, false).is_object())
            << "arguments are no JSON object: " << args;
        break;
      }
    }
  }
  out.complete = !in_call;
  return out;
}

std::vector<std::string_view> random_pieces(std::string_view text, std::mt19937& rng) {
  std::vector<std::string_view> pieces;
  std::uniform_int_distribution<size_t> len(1, 12);
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min(len(rng), text.size() - i);
    pieces.push_back(text.substr(i, n));
    i += n;
  }
  return pieces;
}

class ParserOracle : public ::testing::TestWithParam<std::string> {};

const ojson& template_entry(const std::string& file) {
  for (const auto& t : fixture().at("templates"))
    if (t.at("template") == file) return t;
  throw std::runtime_error("no fixture for " + file);
}

OutputParserOptions options_for(const ojson& c) {
  OutputParserOptions o;
  o.parse_tools = true;
  o.parse_thinking = true;
  o.starts_in_thinking = c.at("starts_in_thinking").get<bool>();
  o.tools = offered_tools();
  return o;
}

TEST_P(ParserOracle, RecoversWhatTheTemplateWrote) {
  const ojson& entry = template_entry(GetParam());
  const OutputFormat format = format_of(GetParam());
  EXPECT_NE(format, OutputFormat::plain);
  std::mt19937 rng(1234);
  int checked = 0;
  for (const auto& c : entry.at("cases")) {
    SCOPED_TRACE(GetParam() + " / " + c.at("name").get<std::string>() + " (" + output_format_name(format) +
                 ")");
    const std::string text = c.at("generated").get<std::string>();
    const OutputParserOptions options = options_for(c);
    std::vector<std::vector<std::string_view>> splits = {{text}};
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
    splits.push_back(bytes);
    for (int r = 0; r < 20; ++r) splits.push_back(random_pieces(text, rng));
    for (const auto& pieces : splits) {
      const Parsed p = run(format, options, pieces);
      ASSERT_EQ(p.reasoning, c.at("reasoning").get<std::string>()) << text;
      ASSERT_EQ(p.content, c.at("content").get<std::string>()) << text;
      const auto& calls = c.at("tool_calls");
      ASSERT_EQ(p.calls.size(), calls.size()) << text;
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(p.calls[i].first, calls[i].at("name").get<std::string>());
        // JSON-equal: nlohmann's plain json compares objects regardless of key order, and 2.5 == 2.5.
        EXPECT_EQ(nlohmann::json::parse(p.calls[i].second, nullptr, false),
                  nlohmann::json(calls[i].at("arguments")))
            << p.calls[i].second;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 16);
}

TEST_P(ParserOracle, OutputCutOffAnywhereStillParses) {
  const ojson& entry = template_entry(GetParam());
  const OutputFormat format = format_of(GetParam());
  std::mt19937 rng(99);
  for (const auto& c : entry.at("cases")) {
    SCOPED_TRACE(GetParam() + " / " + c.at("name").get<std::string>());
    const std::string text = c.at("generated").get<std::string>();
    const OutputParserOptions options = options_for(c);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      // The engine stops between characters, never inside one.
      if (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;
      const std::string_view prefix = std::string_view(text).substr(0, cut);
      const Parsed whole = run(format, options, {prefix});
      EXPECT_TRUE(whole.complete) << "a call was left open at finish: " << prefix;
      const Parsed split = run(format, options, random_pieces(prefix, rng));
      EXPECT_EQ(split.reasoning, whole.reasoning);
      EXPECT_EQ(split.content, whole.content);
      EXPECT_EQ(split.calls, whole.calls) << prefix;
    }
  }
}

std::vector<std::string> template_files() {
  std::vector<std::string> files;
  for (const auto& t : fixture().at("templates")) files.push_back(t.at("template").get<std::string>());
  return files;
}

INSTANTIATE_TEST_SUITE_P(Templates, ParserOracle, ::testing::ValuesIn(template_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(0, info.param.size() - 6);
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(ParserOracle, CoversSevenTemplatesInFourFormats) {
  EXPECT_EQ(template_files().size(), 7u);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.1.jinja"), OutputFormat::deepseek_v3);
  EXPECT_EQ(format_of("deepseek-ai-DeepSeek-V3.2.jinja"), OutputFormat::deepseek_v32);
  for (const char* kimi : {"moonshotai-Kimi-K2.jinja", "Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja"})
    EXPECT_EQ(format_of(kimi), OutputFormat::kimi_k2) << kimi;
  EXPECT_EQ(format_of("GLM-4.6.jinja"), OutputFormat::glm4);
  EXPECT_EQ(format_of("GLM-4.7-Flash.jinja"), OutputFormat::glm4);
  // The families detected before these keep their formats.
  EXPECT_EQ(format_of("Qwen-Qwen3-0.6B.jinja"), OutputFormat::qwen3);
  EXPECT_EQ(format_of("Qwen3-Coder.jinja"), OutputFormat::qwen3_coder);
  EXPECT_EQ(format_of("openai-gpt-oss-120b.jinja"), OutputFormat::harmony);
}

}  // namespace
}  // namespace xmoe::serve
