// Chat templates: xmoe's Jinja subset against Python jinja2 set up as transformers does (fixtures made by
// tools/make_template_fixtures.py), plus the error behaviour the fixtures cannot show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "llm/arch/deepseek_v3_chat_template.hpp"
#include "llm/arch/glm4_moe_chat_template.hpp"
#include "llm/arch/glm4_moe_lite_chat_template.hpp"
#include "llm/arch/kimi_k2_chat_template.hpp"
#include "xmoe/chat_template.hpp"
#include "xmoe/error.hpp"

namespace {

namespace fs = std::filesystem;

fs::path fixture_dir() {
  return fs::path(XMOE_TEST_DATA_DIR) / "chat_templates";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The instant the fixture generator pins strftime_now to (2026-03-07 09:05:04).
std::tm fixed_now() {
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 9;
  tm.tm_min = 5;
  tm.tm_sec = 4;
  tm.tm_wday = 6;
  tm.tm_yday = 65;
  return tm;
}

std::vector<fs::path> fixture_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(fixture_dir()))
    if (entry.path().extension() == ".json" && entry.path().stem() != "constructs")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

class TemplateFixture : public ::testing::TestWithParam<fs::path> {};

TEST_P(TemplateFixture, MatchesPythonJinja2ByteForByte) {
  const auto fixture = nlohmann::ordered_json::parse(read_file(GetParam()));
  const std::string template_file = fixture.at("template").get<std::string>();
  const auto tmpl = xmoe::ChatTemplate::parse(read_file(fixture_dir() / template_file), template_file);
  int rendered = 0, raised = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(template_file + " / " + name);
    if (c.contains("expected")) {
      std::string got;
      ASSERT_NO_THROW(got = tmpl.render_ordered(c.at("context"), fixed_now()));
      EXPECT_EQ(got, c.at("expected").get<std::string>());
      ++rendered;
    } else {
      const std::string message = c.at("error").at("message").get<std::string>();
      try {
        tmpl.render_ordered(c.at("context"), fixed_now());
        ADD_FAILURE() << "expected an error: " << message;
      } catch (const xmoe::Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(message), std::string::npos) << "got: " << what << "\nwant: " << message;
        EXPECT_NE(what.find(template_file), std::string::npos) << what;
        EXPECT_NE(what.find(", line "), std::string::npos) << what;
      }
      ++raised;
    }
  }
  EXPECT_GT(rendered, 0);
  RecordProperty("rendered", rendered);
  RecordProperty("raised", raised);
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, TemplateFixture, ::testing::ValuesIn(fixture_files()),
                         [](const auto& info) {
                           std::string n = info.param.stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

// The render budget must leave room for real use: every real template renders a 250-turn conversation of
// 1.8 KB messages (450 KB) well inside it.
TEST_P(TemplateFixture, LongConversationFitsTheRenderBudget) {
  const auto fixture = nlohmann::ordered_json::parse(read_file(GetParam()));
  const std::string template_file = fixture.at("template").get<std::string>();
  const auto tmpl = xmoe::ChatTemplate::parse(read_file(fixture_dir() / template_file), template_file);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are terse."}});
  const std::string text(1800, 'w');
  for (int turn = 0; turn < 250; ++turn)
    messages.push_back({{"role", turn % 2 == 0 ? "user" : "assistant"}, {"content", text}});
  const nlohmann::ordered_json context = {
      {"messages", messages}, {"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::string out;
  try {
    out = tmpl.render_ordered(context, fixed_now());
  } catch (const xmoe::Error& e) {
    FAIL() << template_file << ": " << e.what();
  }
  EXPECT_GT(out.size(), 250u * 1800u) << template_file;
}

// One small template per construct (whitespace control, Python printing, scoping, filters, tests, errors).
TEST(ChatTemplateConstructs, MatchPythonJinja2ByteForByte) {
  const auto fixture = nlohmann::ordered_json::parse(read_file(fixture_dir() / "constructs.json"));
  int checked = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const std::string source = c.at("template").get<std::string>();
    std::optional<xmoe::ChatTemplate> tmpl;
    ASSERT_NO_THROW(tmpl.emplace(xmoe::ChatTemplate::parse(source, name)));
    if (c.contains("expected")) {
      std::string got;
      ASSERT_NO_THROW(got = tmpl->render_ordered(c.at("context"), fixed_now()));
      EXPECT_EQ(got, c.at("expected").get<std::string>());
    } else {
      const std::string message = c.at("error").at("message").get<std::string>();
      try {
        tmpl->render_ordered(c.at("context"), fixed_now());
        ADD_FAILURE() << "expected an error: " << message;
      } catch (const xmoe::Error& e) {
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << "got: " << e.what();
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(ChatTemplateFixtures, CoverAllThirteenTemplates) {
  EXPECT_EQ(fixture_files().size(), 13u);
}

// The headers the architectures embed (generated by tools/make_chat_template_headers.py) hold the published
// templates byte for byte, so what init-model writes is what the fixtures above test.
TEST(ChatTemplateHeaders, EmbedThePublishedTemplatesVerbatim) {
  const std::pair<std::string_view, const char*> headers[] = {
      {xmoe::llm::kDeepseekV3ChatTemplate, "deepseek-ai-DeepSeek-V3.1.jinja"},
      {xmoe::llm::kKimiK2ChatTemplate, "Kimi-K2-Instruct.jinja"},
      {xmoe::llm::kGlm4MoeChatTemplate, "GLM-4.6.jinja"},
      {xmoe::llm::kGlm4MoeLiteChatTemplate, "GLM-4.7-Flash.jinja"},
  };
  for (const auto& [text, file] : headers) {
    SCOPED_TRACE(file);
    EXPECT_EQ(std::string(text), read_file(fixture_dir() / file));
    EXPECT_NO_THROW(xmoe::ChatTemplate::parse(std::string(text), file));
  }
}

std::string render(const std::string& source,
                   const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  return xmoe::ChatTemplate::parse(source, "inline").render_ordered(context);
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ChatTemplateErrors, UnsupportedTagNamesTemplateLineAndConstruct) {
  const std::string what =
      error_of([] { xmoe::ChatTemplate::parse("a\nb\n  {% include 'x.j2' %}", "t.jinja"); });
  EXPECT_NE(what.find("t.jinja"), std::string::npos) << what;
  EXPECT_NE(what.find("line 3"), std::string::npos) << what;
  EXPECT_NE(what.find("column 6"), std::string::npos) << what;
  EXPECT_NE(what.find("include"), std::string::npos) << what;
  const std::string unknown = error_of([] { xmoe::ChatTemplate::parse("{% frobnicate %}", "u"); });
  EXPECT_NE(unknown.find("unknown tag 'frobnicate'"), std::string::npos) << unknown;
  const std::string unclosed = error_of([] { xmoe::ChatTemplate::parse("{% if x %}\nyes\n", "v"); });
  EXPECT_NE(unclosed.find("endif"), std::string::npos) << unclosed;
  const std::string bad_expr = error_of([] { xmoe::ChatTemplate::parse("\n{{ a + }}", "w"); });
  EXPECT_NE(bad_expr.find("line 2"), std::string::npos) << bad_expr;
  // Text before the tag on the same line shifts the column by its length (the lexer counts columns from
  // the line's start as it goes, not by searching back per token).
  const auto column_of = [](const std::string& what) {
    const size_t at = what.find("column ");
    return at == std::string::npos ? -1 : std::stoi(what.substr(at + 7));
  };
  const std::string shifted =
      error_of([] { xmoe::ChatTemplate::parse("{{ 1 }}\n" + std::string(5000, 'x') + "{{ a + }}", "w"); });
  EXPECT_NE(shifted.find("line 2"), std::string::npos) << shifted;
  EXPECT_EQ(column_of(shifted), column_of(bad_expr) + 5000) << shifted << " / " << bad_expr;
  EXPECT_NE(
      error_of([] { xmoe::ChatTemplate::parse("{# never closed", "c"); }).find("Missing end of comment"),
      std::string::npos);
  EXPECT_NE(error_of([] {
              xmoe::ChatTemplate::parse("{% for x in y recursive %}{% endfor %}", "r");
            }).find("recursive"),
            std::string::npos);
}

TEST(ChatTemplateErrors, RaiseExceptionMessagePropagatesWithLine) {
  const std::string what =
      error_of([] { render("ok\n{% if true %}{{ raise_exception('bad role: ' ~ 7) }}{% endif %}"); });
  EXPECT_NE(what.find("bad role: 7"), std::string::npos) << what;
  EXPECT_NE(what.find("line 2"), std::string::npos) << what;
  EXPECT_NE(what.find("'inline'"), std::string::npos) << what;
}

TEST(ChatTemplateErrors, UndefinedBehavesLikeJinja2) {
  // Printing, testing, iterating and filtering an undefined name is fine and yields nothing.
  EXPECT_EQ(render("[{{ nope }}|{{ nope is defined }}|{{ nope | length }}|{% for x in nope %}x{% endfor %}|"
                   "{{ nope | default('d') }}|{{ {'a': 1}.b }}]"),
            "[|False|0||d|]");
  // Using it further raises UndefinedError with jinja2's message.
  EXPECT_NE(error_of([] { render("{{ nope.attr }}"); }).find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of([] { render("{{ nope + 1 }}"); }).find("UndefinedError"), std::string::npos);
  EXPECT_NE(error_of([] {
              render("{{ x.y.z }}", {{"x", {{"a", 1}}}});
            }).find("'dict object' has no attribute 'y'"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              render("{{ x[3].a }}", {{"x", {1}}});
            }).find("list object has no element 3"),
            std::string::npos);
}

TEST(ChatTemplateErrors, SandboxRefusesMutation) {
  const std::string what = error_of([] { render("{% set l = [1] %}{% set _ = l.append(2) %}"); });
  EXPECT_NE(what.find("access to attribute 'append' of 'list' object is unsafe."), std::string::npos) << what;
  EXPECT_NE(error_of([] { render("{{ ''.__class__() }}"); }).find("unsafe"), std::string::npos);
  EXPECT_NE(error_of([] { render("{% set ns = namespace(_x=1) %}"); }).find("underscore"), std::string::npos);
}

TEST(ChatTemplateErrors, BadContextIsAnErrorNotACrash) {
  const auto tmpl = xmoe::ChatTemplate::parse("{{ messages }}", "ctx");
  EXPECT_THROW(tmpl.render(nlohmann::json::array()), xmoe::Error);
  EXPECT_THROW(tmpl.render(nlohmann::json{{"messages", "\xff\xfe"}}), xmoe::Error);
  EXPECT_THROW(render("{{ s | length }}", {{"s", "bad \xc3"}}), xmoe::Error);
  EXPECT_THROW(render("{{ s }}", {{"s", "\xed\xa0\x80"}}), xmoe::Error);  // a UTF-8-encoded surrogate
  EXPECT_THROW(xmoe::ChatTemplate::parse("ok \xc0\xaf", "overlong"), xmoe::Error);
  EXPECT_EQ(render("{{ s | length }}", {{"s", "\xf0\x9f\x98\x80\xc3\xa9"}}), "2");
  EXPECT_THROW(render("{{ 1 / 0 }}"), xmoe::Error);
  EXPECT_THROW(render("{{ 'a' + 1 }}"), xmoe::Error);
  EXPECT_THROW(render("{{ range(1000000) | length }}"), xmoe::Error);
  // Python's integers are unbounded; ours stop at 64 bits with an error rather than wrapping.
  EXPECT_THROW(render("{{ 2 ** 100 }}"), xmoe::Error);
  EXPECT_THROW(render("{{ 9223372036854775807 + 1 }}"), xmoe::Error);
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ -9223372036854775807 - 1 }}"),
            "4611686018427387904 -9223372036854775808");
  EXPECT_THROW(render("{{ 'ab' * 1000000000 }}"), xmoe::Error);
  EXPECT_THROW(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"), xmoe::Error);
}

TEST(ChatTemplate, SortedJsonOverloadRenders) {
  const auto tmpl = xmoe::ChatTemplate::parse("{{ d | tojson }}", "sorted");
  EXPECT_EQ(tmpl.render(nlohmann::json{{"d", {{"b", 1}, {"a", 2}}}}), "{\"a\": 2, \"b\": 1}");
  EXPECT_EQ(tmpl.name(), "sorted");
}

// Damaged templates (every prefix at a stride, and random byte edits) either render or fail with xmoe::Error:
// nothing else escapes, nothing crashes.
TEST(ChatTemplateRobustness, DamagedTemplatesFailCleanly) {
  const auto context = nlohmann::ordered_json::parse(R"({"messages": [{"role": "system", "content": "s"},
      {"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}],
      "tools": null, "add_generation_prompt": true, "bos_token": "<s>"})");
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+()[]|.,:'\"~= \nabcdefghijklmnopqrstuvwxyz0123456789";
  int parsed = 0, rejected = 0;
  for (const auto& file : fixture_files()) {
    const std::string source = read_file(fixture_dir() / (file.stem().string() + ".jinja"));
    std::vector<std::string> variants;
    for (size_t cut = 0; cut < source.size(); cut += 41) variants.push_back(source.substr(0, cut));
    for (int k = 0; k < 150; ++k) {
      std::string damaged = source;
      for (int edits = 0; edits < 3; ++edits)
        damaged[rng() % damaged.size()] = alphabet[rng() % alphabet.size()];
      variants.push_back(std::move(damaged));
    }
    for (const auto& text : variants) {
      try {
        const auto tmpl = xmoe::ChatTemplate::parse(text, "damaged");
        ++parsed;
        (void)tmpl.render_ordered(context, fixed_now());
      } catch (const xmoe::Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rejected, 100);
}

TEST(ChatTemplateRobustness, DeepNestingIsAnError) {
  EXPECT_THROW(xmoe::ChatTemplate::parse(
                   "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "deep"),
               xmoe::Error);
  EXPECT_THROW(xmoe::ChatTemplate::parse("{{ " + std::string(5000, '-') + "1 }}", "neg"), xmoe::Error);
  std::string nested_ifs;
  for (int i = 0; i < 3000; ++i) nested_ifs += "{% if x %}";
  EXPECT_THROW(xmoe::ChatTemplate::parse(nested_ifs, "ifs"), xmoe::Error);
  // A namespace made to contain itself: printing it must stop with an error.
  EXPECT_THROW(render("{% set ns = namespace(a=[]) %}{% set ns.a = [ns] %}{{ ns }}"), xmoe::Error);
  // A list nested by a loop past the limit.
  EXPECT_THROW(
      render("{% set ns = namespace(a=[]) %}{% for i in range(1000) %}{% set ns.a = [ns.a] %}{% endfor %}"),
      xmoe::Error);
  nlohmann::ordered_json deep = 1;
  for (int i = 0; i < 600; ++i) deep = nlohmann::ordered_json::array({deep});
  const auto tmpl = xmoe::ChatTemplate::parse("{{ x }}", "ctx");
  EXPECT_THROW(tmpl.render_ordered({{"x", deep}}), xmoe::Error);
}

// Found by tests/fuzz (jinja_template): a template is untrusted input, so one render must end and stay
// bounded in memory however it loops or grows values.
TEST(ChatTemplateRobustness, HostileTemplatesAreBoundedInTimeAndMemory) {
  const std::string loops = error_of(
      [] { render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"); });
  EXPECT_NE(loops.find("line 1: ResourceError: the template ran over 1000000 operations"), std::string::npos)
      << loops;
  // Values past the size limits are refused before they are allocated.
  EXPECT_NE(error_of([] { render("{{ 'ab' * 40000000 }}"); }).find("MemoryError"), std::string::npos);
  EXPECT_NE(error_of([] { render("{{ [1, 2] * 100000000 }}"); }).find("MemoryError"), std::string::npos);
  // Doubling a string or list in a loop: the work of copying them is counted, and ends the render long before
  // the size limits.
  const std::string doubling = error_of([] {
    render("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  });
  EXPECT_NE(doubling.find("ResourceError: the template ran over"), std::string::npos) << doubling;
  const std::string list = error_of([] {
    render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}");
  });
  EXPECT_NE(list.find("ResourceError: the template ran over"), std::string::npos) << list;
  // Operations that look like one step but walk a large value each time (found by fuzz_jinja_template: nested
  // loops over a 400-character string took seconds), each repeated far more often than the budget allows.
  for (const char* work : {
           "{% set s = 'ab' * 2000000 %}{% for i in range(100000) %}{% if 'zz' in s %}{% endif %}{% endfor "
           "%}",
           // Each character a loop makes is paid before it is made.
           "{% set s = 'ab' * 600000 %}{% for c in s %}{% break %}{% endfor %}",
           "{% set l = range(100000)|list %}{% for i in range(100000) %}{% for x in l %}{% break %}{% endfor "
           "%}{% endfor %}",
           "{% set a = [range(1000)|list] * 1000 %}{% set b = [range(1000)|list] * 1000 %}"
           "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
           "{% set a = [range(1000)|list] * 1000 %}{{ [a] * 1000 }}",
           "{% for i in range(100000) %}{% set x = 'a' * 60000000 %}{% endfor %}",
           // An iteration pays for the loop object it builds (found by fuzz_jinja_template: nested loops over
           // a 400-character string with a cheap body took about a second under ASan).
           "{% for a in range(400) %}{% for b in range(700) %}{% endfor %}{% endfor %}",
           // A call builds its arguments and a result, a printed list goes through repr: one step each (found
           // by fuzz_jinja_template: cheap string-method calls and printed lists in nested loops took 1.33
           // s).
           "{% for a in range(300) %}{% for b in range(200) %}{{ 'a'.lower() }}{{ [b] }}{% endfor %}{% "
           "endfor %}",
       }) {
    const std::string error = error_of([&] { render(work); });
    EXPECT_NE(error.find("ResourceError: the template ran over 1000000 operations"), std::string::npos)
        << work << ": " << error;
  }
  // Far below the limits, as chat templates are: 2000 messages render.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (int i = 0; i < 2000; ++i)
    messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "hi"}});
  const std::string out = render(
      "{% for m in messages %}{% if m.role == 'user' %}<u>{{ m.content }}{% else %}<a>{{ m.content }}{% "
      "endif %}"
      "{% endfor %}",
      {{"messages", messages}});
  EXPECT_EQ(out.size(), 2000u * 5);
}

}  // namespace
