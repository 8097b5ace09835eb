// Output parsers on scripted model text: each text is parsed whole, byte by byte and split at every position
// (and at every pair of positions); the events, with adjacent pieces of the same kind joined, must be the
// same every time and equal the expected parse. Tool arguments must concatenate to JSON that parses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/json_prefix.hpp"
#include "serve/output_parser.hpp"

namespace xmoe::serve {
namespace {

using Kind = OutputEvent::Kind;

struct Ev {
  Kind kind;
  std::string text;  // text / thinking / the whole arguments / the tool name for begin
  int index = 0;
  bool operator==(const Ev&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Ev& e) {
  return os << "{" << static_cast<int>(e.kind) << ", '" << e.text << "', " << e.index << "}";
}

// Joins adjacent text/thinking/argument pieces (how they were split is not behaviour).
std::vector<Ev> normalize(const std::vector<OutputEvent>& events) {
  std::vector<Ev> out;
  for (const OutputEvent& e : events) {
    const bool joinable =
        e.kind == Kind::text || e.kind == Kind::thinking || e.kind == Kind::tool_call_arguments;
    if (e.kind == Kind::tool_call_begin) {
      EXPECT_TRUE(e.tool_id.empty());
      out.push_back(Ev{e.kind, e.tool_name, e.tool_index});
      continue;
    }
    if (joinable && !out.empty() && out.back().kind == e.kind && out.back().index == e.tool_index) {
      out.back().text += e.text;
      continue;
    }
    EXPECT_TRUE(!joinable || !e.text.empty()) << "empty piece";
    out.push_back(Ev{e.kind, e.text, e.tool_index});
  }
  return out;
}

std::vector<Ev> parse(OutputFormat f, const OutputParserOptions& o,
                      const std::vector<std::string_view>& pieces) {
  auto p = make_output_parser(f, o);
  std::vector<OutputEvent> events;
  for (std::string_view s : pieces) p->push(s, events);
  p->finish(events);
  return normalize(events);
}

void check_every_split(OutputFormat f, const OutputParserOptions& o, const std::string& text,
                       const std::vector<Ev>& expected) {
  ASSERT_EQ(parse(f, o, {text}), expected) << text;
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  ASSERT_EQ(parse(f, o, bytes), expected) << "byte by byte: " << text;
  const std::string_view t = text;
  for (size_t a = 0; a <= t.size(); ++a) {
    ASSERT_EQ(parse(f, o, {t.substr(0, a), t.substr(a)}), expected) << "split at " << a << ": " << text;
    if (t.size() <= 160) {
      for (size_t b = a; b <= t.size(); b += 3)
        ASSERT_EQ(parse(f, o, {t.substr(0, a), t.substr(a, b - a), t.substr(b)}), expected)
            << "split at " << a << "," << b << ": " << text;
    }
  }
  for (const Ev& e : expected)
    if (e.kind == Kind::tool_call_arguments) {
      const auto j = nlohmann::json::parse(e.text, nullptr, false);
      EXPECT_TRUE(j.is_object()) << e.text;
    }
}

OutputParserOptions with_tools() {
  OutputParserOptions o;
  o.parse_tools = true;
  return o;
}

TEST(Qwen3Parser, ThinkingThenAnswer) {
  check_every_split(OutputFormat::qwen3, with_tools(),
                    "<think>\nLet me think.\nStep 2.\n</think>\n\nThe answer is 4.",
                    {{Kind::thinking, "Let me think.\nStep 2."}, {Kind::text, "The answer is 4."}});
}

TEST(Qwen3Parser, EmptyThinkingBlock) {
  check_every_split(OutputFormat::qwen3, with_tools(), "<think>\n\n</think>\n\nHi", {{Kind::text, "Hi"}});
}

TEST(Qwen3Parser, PromptOpenedThinking) {
  OutputParserOptions o = with_tools();
  o.starts_in_thinking = true;
  check_every_split(OutputFormat::qwen3, o, "reason < a </b>\n</think>\n\nanswer <i>x</i>",
                    {{Kind::thinking, "reason < a </b>"}, {Kind::text, "answer <i>x</i>"}});
}

TEST(Qwen3Parser, TextThenToolCall) {
  check_every_split(
      OutputFormat::qwen3, with_tools(),
      "I'll check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, "
      "\\\"FR\\\"\", "
      "\"days\": [1, 2.5e1, -0], \"x\": {\"y\": null, \"z\": true}}}\n</tool_call>",
      {{Kind::text, "I'll check."},
       {Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments,
        "{\"location\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2.5e1, -0], \"x\": {\"y\": null, \"z\": true}}"},
       {Kind::tool_call_end, ""}});
}

TEST(Qwen3Parser, ThinkingAndTwoCalls) {
  check_every_split(
      OutputFormat::qwen3, with_tools(),
      "<think>\nneed tools\n</think>\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\":\"b\",\"arguments\":{\"q\":\"</tool\"}}\n</tool_call>",
      {{Kind::thinking, "need tools"},
       {Kind::tool_call_begin, "a", 0},
       {Kind::tool_call_arguments, "{}", 0},
       {Kind::tool_call_end, "", 0},
       {Kind::tool_call_begin, "b", 1},
       {Kind::tool_call_arguments, "{\"q\":\"</tool\"}", 1},
       {Kind::tool_call_end, "", 1}});
}

TEST(Qwen3Parser, OtherKeyOrderIsParsedWhole) {
  check_every_split(
      OutputFormat::qwen3, with_tools(),
      "<tool_call>\n{\"arguments\": {\"k\": 1}, \"name\": \"f\"}\n</tool_call>",
      {{Kind::tool_call_begin, "f"}, {Kind::tool_call_arguments, "{\"k\":1}"}, {Kind::tool_call_end, ""}});
}

TEST(Qwen3Parser, MalformedCallIsText) {
  check_every_split(OutputFormat::qwen3, with_tools(), "Sure <tool_call>not json</tool_call> ok",
                    {{Kind::text, "Sure <tool_call>not json</tool_call> ok"}});
}

TEST(Qwen3Parser, UnterminatedMarkupAtFinishIsText) {
  check_every_split(OutputFormat::qwen3, with_tools(), "Hello <tool_call>\n{\"na",
                    {{Kind::text, "Hello <tool_call>\n{\"na"}});
  check_every_split(OutputFormat::qwen3, with_tools(), "a <thi", {{Kind::text, "a <thi"}});
  check_every_split(OutputFormat::qwen3, with_tools(), "x <tool_cal", {{Kind::text, "x <tool_cal"}});
}

TEST(Qwen3Parser, CallCutOffByLengthIsClosedSoItParses) {
  check_every_split(OutputFormat::qwen3, with_tools(),
                    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"x\\u00",
                    {{Kind::tool_call_begin, "f"},
                     {Kind::tool_call_arguments, "{\"a\": [1, {\"b\": \"x\\u0000\"}]}"},
                     {Kind::tool_call_end, ""}});
}

TEST(Qwen3Parser, ToolsNotParsedWhenNotOffered) {
  OutputParserOptions o;
  o.parse_tools = false;
  check_every_split(OutputFormat::qwen3, o, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                    {{Kind::text, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"}});
}

TEST(Qwen3Parser, ForcedPrefixOpensTheCall) {
  OutputParserOptions o = with_tools();
  o.forced_prefix = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
  check_every_split(OutputFormat::qwen3, o, "{\"location\": \"Oslo\"}}\n</tool_call>",
                    {{Kind::tool_call_begin, "get_weather"},
                     {Kind::tool_call_arguments, "{\"location\": \"Oslo\"}"},
                     {Kind::tool_call_end, ""}});
}

TEST(PlainParser, PassesTextThrough) {
  check_every_split(OutputFormat::plain, with_tools(), " <think>x</think> <tool_call>",
                    {{Kind::text, " <think>x</think> <tool_call>"}});
}

OutputParserOptions coder_options() {
  OutputParserOptions o = with_tools();
  ToolDefinition t;
  t.name = "get_weather";
  t.parameters = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "location": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "scale": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
      "maybe": {"type": ["integer", "null"]}}})");
  o.tools.push_back(t);
  return o;
}

TEST(Qwen3CoderParser, ValuesTypedBySchema) {
  check_every_split(
      OutputFormat::qwen3_coder, coder_options(),
      "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, \"FR\"\n</parameter>\n"
      "<parameter=days>\n2\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=scale>\n1.5\n"
      "</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n"
      "<parameter=maybe>\nnull\n</parameter>\n<parameter=other>\n42\n</parameter>\n</function>\n</tool_call>",
      {{Kind::text, "Checking."},
       {Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments,
        "{\"location\": \"Paris, \\\"FR\\\"\", \"days\": 2, \"metric\": true, \"scale\": 1.5, \"opts\": "
        "{\"a\":[1]}, "
        "\"tags\": [\"x\"], \"maybe\": null, \"other\": \"42\"}"},
       {Kind::tool_call_end, ""}});
}

TEST(Qwen3CoderParser, UntypeableValuesStayStrings) {
  check_every_split(
      OutputFormat::qwen3_coder, coder_options(),
      "<tool_call>\n<function=get_weather>\n<parameter=days>\ntwo\n</parameter>\n<parameter=metric>\n"
      "yes\n</parameter>\n</function>\n</tool_call>",
      {{Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments, "{\"days\": \"two\", \"metric\": \"yes\"}"},
       {Kind::tool_call_end, ""}});
}

TEST(Qwen3CoderParser, TwoCallsAndMissingClosers) {
  check_every_split(
      OutputFormat::qwen3_coder, coder_options(),
      "<tool_call>\n<function=a>\n<parameter=x>\n1\n<parameter=y>\nmulti\nline\n</function>\n</tool_call>"
      "\n<tool_call>\n<function=b>\n</function>\n</tool_call>",
      {{Kind::tool_call_begin, "a", 0},
       {Kind::tool_call_arguments, "{\"x\": \"1\", \"y\": \"multi\\nline\"}", 0},
       {Kind::tool_call_end, "", 0},
       {Kind::tool_call_begin, "b", 1},
       {Kind::tool_call_arguments, "{}", 1},
       {Kind::tool_call_end, "", 1}});
}

TEST(Qwen3CoderParser, CutOffCallIsClosed) {
  check_every_split(OutputFormat::qwen3_coder, coder_options(),
                    "<tool_call>\n<function=get_weather>\n<parameter=location>\nPar",
                    {{Kind::tool_call_begin, "get_weather"},
                     {Kind::tool_call_arguments, "{\"location\": \"Par\"}"},
                     {Kind::tool_call_end, ""}});
  check_every_split(OutputFormat::qwen3_coder, coder_options(), "<tool_call>\n<funct",
                    {{Kind::text, "<tool_call>\n<funct"}});
}

TEST(Qwen3CoderParser, ForcedPrefix) {
  OutputParserOptions o = coder_options();
  o.forced_prefix = "<tool_call>\n<function=get_weather>\n";
  check_every_split(OutputFormat::qwen3_coder, o,
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                    {{Kind::tool_call_begin, "get_weather"},
                     {Kind::tool_call_arguments, "{\"days\": 3}"},
                     {Kind::tool_call_end, ""}});
}

// The JSON prefix checker against nlohmann's parser: every prefix of a valid object is accepted, the
// completion of every prefix parses, and invalid texts are refused at the first bad byte.
TEST(JsonPrefix, PrefixesAndCompletionsOfValidObjects) {
  const std::vector<std::string> docs = {
      R"({})", R"({"a":1})", R"( { "a" : [ 1 , -2.5e+3 , 0.0 , 1E5 ] , "b" : { "c" : null } } )",
      R"({"s":"x\"y\\z\u00e9\n","t":true,"f":false,"n":[[],[{}]],"num":-0})", R"({"k":"é😀"})"};
  for (const std::string& d : docs) {
    const auto ref = nlohmann::json::parse(d);
    const size_t end = d.find_last_not_of(' ') + 1;  // nothing is read after the object
    for (size_t n = 0; n <= end; ++n) {
      JsonPrefix p;
      ASSERT_EQ(p.push(std::string_view(d).substr(0, n)), n) << d << " at " << n;
      if (n < d.size() && (static_cast<unsigned char>(d[n]) & 0xC0) == 0x80) continue;  // inside a character
      const std::string whole = d.substr(0, n) + p.completion();
      const auto j = nlohmann::json::parse(whole, nullptr, false);
      ASSERT_TRUE(j.is_object()) << whole;
      ASSERT_EQ(p.completion().size(), p.completion_size());
    }
    JsonPrefix p;
    p.push(std::string_view(d).substr(0, end));
    EXPECT_TRUE(p.complete()) << d;
    EXPECT_EQ(p.completion(), "");
    EXPECT_EQ(nlohmann::json::parse(d.substr(0, end)), ref);
  }
}

TEST(JsonPrefix, RefusesInvalidText) {
  const std::vector<std::pair<std::string, size_t>> bad = {{"[1]", 0},
                                                           {"{,}", 1},
                                                           {"{\"a\" 1}", 5},
                                                           {"{\"a\":01}", 6},
                                                           {"{\"a\":1.}", 7},
                                                           {"{\"a\":tru}", 8},
                                                           {"{\"a\":\"\\x\"}", 7},
                                                           {"{\"a\":\"\x01\"}", 6},
                                                           {"{\"a\":1,}", 7},
                                                           {"{\"a\":[1 2]}", 8},
                                                           {"{}}", 2},
                                                           {"{\"a\":-}", 6},
                                                           {"{\"a\":1e}", 7},
                                                           {"{\"a\":\"\\u12g4\"}", 10}};
  for (const auto& [text, at] : bad) {
    JsonPrefix p;
    EXPECT_EQ(p.push(text), at) << text;
    if (text[0] == '{') {
      EXPECT_FALSE(nlohmann::json::accept(text)) << text;
    }
  }
}

}  // namespace
}  // namespace xmoe::serve

namespace xmoe::serve {
namespace {

// gpt-oss's harmony: what the model writes after the prompt's "<|start|>assistant" (the markers are special
// tokens, kept in the text stream for this format).
TEST(HarmonyParser, AnalysisThenFinal) {
  check_every_split(OutputFormat::harmony, with_tools(),
                    "<|channel|>analysis<|message|>User asks 2+2. Simple: 4.<|end|><|start|>assistant"
                    "<|channel|>final<|message|>The answer is **4**.\n<|return|>",
                    {{Kind::thinking, "User asks 2+2. Simple: 4."}, {Kind::text, "The answer is **4**.\n"}});
}

TEST(HarmonyParser, OutputEndsAtTheEndOfSequenceToken) {
  // <|return|> and <|call|> are end-of-sequence tokens: the engine stops before their text.
  check_every_split(
      OutputFormat::harmony, with_tools(),
      "<|channel|>analysis<|message|>think <b>x</b> < y<|end|><|start|>assistant<|channel|>final"
      "<|message|>Hi <|there",
      {{Kind::thinking, "think <b>x</b> < y"}, {Kind::text, "Hi <|there"}});
}

TEST(HarmonyParser, ToolCallWithConstrain) {
  check_every_split(
      OutputFormat::harmony, with_tools(),
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Paris, \\\"FR\\\"\", \"days\": "
      "[1, "
      "2]}<|call|>",
      {{Kind::thinking, "Need weather."},
       {Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments, "{\"location\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2]}"},
       {Kind::tool_call_end, ""}});
}

TEST(HarmonyParser, RecipientInTheRoleHeaderAndTwoCalls) {
  check_every_split(OutputFormat::harmony, with_tools(),
                    "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.a"
                    "<|channel|>commentary json<|message|>{}<|call|><|start|>assistant<|channel|>commentary "
                    "to=functions.b <|constrain|>json<|message|>{\"q\":\"<|end\"}<|call|>",
                    {{Kind::text, "Checking both."},
                     {Kind::tool_call_begin, "a", 0},
                     {Kind::tool_call_arguments, "{}", 0},
                     {Kind::tool_call_end, "", 0},
                     {Kind::tool_call_begin, "b", 1},
                     {Kind::tool_call_arguments, "{\"q\":\"<|end\"}", 1},
                     {Kind::tool_call_end, "", 1}});
}

TEST(HarmonyParser, CallCutOffByLengthIsClosedSoItParses) {
  check_every_split(
      OutputFormat::harmony, with_tools(),
      "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": [1, {\"b\": \"x",
      {{Kind::tool_call_begin, "f"},
       {Kind::tool_call_arguments, "{\"a\": [1, {\"b\": \"x\"}]}"},
       {Kind::tool_call_end, ""}});
}

TEST(HarmonyParser, ToolsNotOfferedAndThinkingOff) {
  OutputParserOptions o;
  o.parse_tools = false;
  o.parse_thinking = false;
  check_every_split(OutputFormat::harmony, o,
                    "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>commentary "
                    "to=functions.f <|constrain|>json<|message|>{}<|call|>",
                    {{Kind::text, "hmm{}"}});
}

TEST(HarmonyParser, UnterminatedHeaderIsText) {
  check_every_split(OutputFormat::harmony, with_tools(), "<|channel|>fin", {{Kind::text, "<|channel|>fin"}});
  check_every_split(OutputFormat::harmony, with_tools(), "no markup at all",
                    {{Kind::text, "no markup at all"}});
}

TEST(HarmonyParser, ForcedPrefixOpensTheCall) {
  OutputParserOptions o = with_tools();
  o.forced_prefix = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
  check_every_split(OutputFormat::harmony, o, "{\"location\": \"Oslo\"}<|call|>",
                    {{Kind::tool_call_begin, "get_weather"},
                     {Kind::tool_call_arguments, "{\"location\": \"Oslo\"}"},
                     {Kind::tool_call_end, ""}});
  o.forced_prefix = "<|channel|>commentary to=functions.";
  check_every_split(OutputFormat::harmony, o, "lookup <|constrain|>json<|message|>{\"k\": 1}",
                    {{Kind::tool_call_begin, "lookup"},
                     {Kind::tool_call_arguments, "{\"k\": 1}"},
                     {Kind::tool_call_end, ""}});
}

// DeepSeek, Kimi and GLM beyond what their templates write (tests/serve/test_output_parser_oracle.cpp has
// those): what their parsers do with text the templates never produce.
OutputParserOptions with_weather_schema() {
  OutputParserOptions o = with_tools();
  ToolDefinition t;
  t.name = "get_weather";
  t.parameters = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})");
  o.tools.push_back(t);
  return o;
}

TEST(DeepseekV3Parser, CallWithoutSeparatorOrJsonIsText) {
  check_every_split(OutputFormat::deepseek_v3, with_tools(), "a<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>b",
                    {{Kind::text, "a<｜tool▁call▁begin｜>f{}<｜tool▁call▁end｜>b"}});
  check_every_split(OutputFormat::deepseek_v3, with_tools(),
                    "<｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>",
                    {{Kind::text, "<｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜>"}});
}

TEST(DeepseekV3Parser, CutOffCallIsClosedAndGroupMarkersDropped) {
  check_every_split(OutputFormat::deepseek_v3, with_tools(),
                    "ok <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [\"x",
                    {{Kind::text, "ok"},
                     {Kind::tool_call_begin, "f"},
                     {Kind::tool_call_arguments, "{\"a\": [\"x\"]}"},
                     {Kind::tool_call_end, ""}});
}

// DeepSeek-V3 and R1's templates write the call's type, then the name, then the arguments in a JSON fence.
TEST(DeepseekV3Parser, V3AndR1FencedCalls) {
  OutputParserOptions o = with_tools();
  o.starts_in_thinking = true;
  check_every_split(
      OutputFormat::deepseek_v3, o,
      "hm</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {{Kind::thinking, "hm"},
       {Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments, "{\"city\": \"Oslo\"}"},
       {Kind::tool_call_end, ""}});
  // A tool that is itself named "function", in V3.1's markup.
  check_every_split(OutputFormat::deepseek_v3, with_tools(),
                    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>",
                    {{Kind::tool_call_begin, "function"},
                     {Kind::tool_call_arguments, "{\"a\": 1}"},
                     {Kind::tool_call_end, ""}});
}

TEST(DeepseekV3Parser, ToolsNotOfferedLeavesMarkersAsText) {
  OutputParserOptions o;
  o.parse_tools = false;
  o.starts_in_thinking = true;
  check_every_split(OutputFormat::deepseek_v3, o, "r</think><｜tool▁calls▁begin｜>x",
                    {{Kind::thinking, "r"}, {Kind::text, "<｜tool▁calls▁begin｜>x"}});
}

TEST(DeepseekV32Parser, ParameterWithoutStringAttributeFollowsTheSchema) {
  check_every_split(
      OutputFormat::deepseek_v32, with_weather_schema(),
      "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\">7</｜DSML｜parameter>"
      "<｜DSML｜parameter name=\"days\">7</｜DSML｜parameter><｜DSML｜parameter name=\"x\" "
      "string=\"false\">not json</｜DSML｜parameter></｜DSML｜invoke>",
      {{Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments, "{\"city\": \"7\", \"days\": 7, \"x\": \"not json\"}"},
       {Kind::tool_call_end, ""}});
}

TEST(DeepseekV32Parser, CutOffInsideAValue) {
  check_every_split(OutputFormat::deepseek_v32, with_tools(),
                    "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">abc",
                    {{Kind::tool_call_begin, "f"},
                     {Kind::tool_call_arguments, "{\"q\": \"abc\"}"},
                     {Kind::tool_call_end, ""}});
}

TEST(KimiK2Parser, CallIdWithoutNamespaceAndCutOffArguments) {
  check_every_split(
      OutputFormat::kimi_k2, with_tools(),
      "<|tool_calls_section_begin|><|tool_call_begin|>lookup<|tool_call_argument_begin|>{\"k\": tr",
      {{Kind::tool_call_begin, "lookup"},
       {Kind::tool_call_arguments, "{\"k\": true}"},
       {Kind::tool_call_end, ""}});
}

TEST(KimiK2Parser, CallWithoutArgumentMarkerIsText) {
  check_every_split(OutputFormat::kimi_k2, with_tools(), "x<|tool_call_begin|>functions.f:0<|tool_call_end|>",
                    {{Kind::text, "x<|tool_call_begin|>functions.f:0<|tool_call_end|>"}});
}

TEST(Glm4Parser, ValuesTypedBySchemaElseJsonElseString) {
  check_every_split(
      OutputFormat::glm4, with_weather_schema(),
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>2</arg_value>\n"
      "<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>o</arg_key><arg_value>{\"a\": 1}"
      "</arg_value><arg_key>s</arg_key><arg_value>a b</arg_value></tool_call>",
      {{Kind::tool_call_begin, "get_weather"},
       {Kind::tool_call_arguments, "{\"city\": \"2\", \"days\": 3, \"o\": {\"a\":1}, \"s\": \"a b\"}"},
       {Kind::tool_call_end, ""}});
}

TEST(Glm4Parser, ProseBetweenMarkersIsNoCall) {
  check_every_split(OutputFormat::glm4, with_tools(), "say <tool_call>not a name</tool_call> ok",
                    {{Kind::text, "say <tool_call>not a name</tool_call> ok"}});
}

TEST(Glm4Parser, CallWithoutArgumentsAndCutOffValue) {
  check_every_split(OutputFormat::glm4, with_tools(),
                    "<tool_call>ping</tool_call><tool_call>f<arg_key>q</arg_key><arg_value>[1, 2",
                    {{Kind::tool_call_begin, "ping", 0},
                     {Kind::tool_call_arguments, "{}", 0},
                     {Kind::tool_call_end, "", 0},
                     {Kind::tool_call_begin, "f", 1},
                     {Kind::tool_call_arguments, "{\"q\": \"[1, 2\"}", 1},
                     {Kind::tool_call_end, "", 1}});
}

TEST(Glm4Parser, ForcedPrefixAfterThePromptsThinking) {
  OutputParserOptions o = with_tools();
  o.starts_in_thinking = true;  // GLM-4.7's prompt ends with <think>; the forced call closes it
  o.forced_prefix = "</think><tool_call>f";
  check_every_split(
      OutputFormat::glm4, o, "<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
      {{Kind::tool_call_begin, "f"}, {Kind::tool_call_arguments, "{\"a\": 1}"}, {Kind::tool_call_end, ""}});
}

}  // namespace
}  // namespace xmoe::serve
