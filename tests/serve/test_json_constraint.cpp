// Forced JSON on a real tokenizer (the Qwen tokenizer fixture, 151669 ids): a "model" with random logits,
// steered only by the logits processor, must always write a tool call / JSON object that parses (checked by
// nlohmann's parser and the Qwen3 output parser), whatever the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "serve/json_constraint.hpp"
#include "serve/output_parser.hpp"

namespace xmoe::serve {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t =
      Tokenizer::from_file(std::string(XMOE_TEST_DATA_DIR) + "/tokenizer/qwen2/tokenizer.json");
  return t;
}

const std::shared_ptr<const TokenTexts>& texts() {
  static const std::shared_ptr<const TokenTexts> t = make_token_texts(tokenizer());
  return t;
}

std::vector<int32_t> eos() {
  return {*tokenizer().token_to_id("<|im_end|>")};
}

// Greedy decoding of random logits under the processor; returns the generated ids.
std::vector<int32_t> generate(const LogitsProcessor& proc, int64_t max_tokens, uint64_t seed,
                              double* step_ms = nullptr) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.f, 3.f);
  const auto vocab = static_cast<size_t>(tokenizer().vocab_size());
  std::vector<int32_t> out;
  std::vector<float> logits(vocab);
  std::vector<double> times;
  const std::vector<int32_t> end = eos();
  while (static_cast<int64_t>(out.size()) < max_tokens) {
    for (float& l : logits) l = normal(gen);
    const auto t0 = std::chrono::steady_clock::now();
    proc(logits, out);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_TRUE(std::isfinite(logits[best])) << "no token allowed";
    out.push_back(best);
    if (std::find(end.begin(), end.end(), best) != end.end()) break;
  }
  if (step_ms && !times.empty()) {
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    *step_ms = times[times.size() / 2];
  }
  return out;
}

std::string text_of(const std::vector<int32_t>& ids) {
  return tokenizer().decode(ids, /*skip_special_tokens=*/true);
}

TEST(ForcedJson, NamedToolCallAlwaysParses) {
  const std::string prefix = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
  for (const int64_t budget : {3, 6, 12, 40, 120}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      JsonConstraint c;
      c.suffix = "}\n</tool_call>";
      c.end_tokens = eos();
      c.max_tokens = budget;
      c.forbidden = {"</tool_call>", "<think>"};
      const std::vector<int32_t> ids = generate(make_json_logits_processor(texts(), c), budget, seed);
      const std::string text = text_of(ids);
      // A budget too small for "{}" and the closing markup ends cut off; the parser closes the arguments.
      const bool room = budget >= 20;
      EXPECT_EQ(text.find("<think>"), std::string::npos) << text;
      EXPECT_EQ(text.find("</tool_call>"), text.rfind("</tool_call>")) << text;
      if (room) {
        ASSERT_TRUE(text.ends_with("}\n</tool_call>")) << budget << "/" << seed << ": " << text;
        ASSERT_TRUE(nlohmann::json::parse(text.substr(0, text.size() - 14), nullptr, false).is_object())
            << text;
      }
      // The Qwen3 parser (started after the forced prefix) reads it as one call with these arguments.
      OutputParserOptions o;
      o.forced_prefix = prefix;
      auto parser = make_output_parser(OutputFormat::qwen3, o);
      std::vector<OutputEvent> events;
      parser->push(text, events);
      parser->finish(events);
      std::string name, arguments;
      int ends = 0;
      for (const OutputEvent& e : events) {
        if (e.kind == OutputEvent::Kind::tool_call_begin) name = e.tool_name;
        if (e.kind == OutputEvent::Kind::tool_call_arguments) arguments += e.text;
        if (e.kind == OutputEvent::Kind::tool_call_end) ++ends;
        EXPECT_NE(e.kind, OutputEvent::Kind::text) << e.text;
      }
      EXPECT_EQ(name, "get_weather");
      EXPECT_EQ(ends, 1);
      const auto args = nlohmann::json::parse(arguments, nullptr, false);
      EXPECT_TRUE(args.is_object()) << arguments;
      if (room) {
        EXPECT_EQ(args, nlohmann::json::parse(text.substr(0, text.size() - 14)));
      }
      // With room to spare the call ends with the end token, not by running out.
      if (budget >= 40 && static_cast<int64_t>(ids.size()) < budget) {
        EXPECT_EQ(ids.back(), eos()[0]);
      }
    }
  }
}

TEST(ForcedJson, RequiredPicksOneOfTheTools) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    JsonConstraint c;
    c.openings = {
        "get_weather\", \"arguments\": ", "get_time\", \"arguments\": ", "search\", \"arguments\": "};
    c.suffix = "}\n</tool_call>";
    c.end_tokens = eos();
    c.max_tokens = 30;
    const std::string text =
        "{\"name\": \"" + text_of(generate(make_json_logits_processor(texts(), c), 30, seed));
    ASSERT_TRUE(text.ends_with("}\n</tool_call>")) << text;
    const auto call = nlohmann::json::parse(text.substr(0, text.size() - 13), nullptr, false);
    ASSERT_TRUE(call.is_object()) << text;
    const std::string name = call["name"];
    EXPECT_TRUE(name == "get_weather" || name == "get_time" || name == "search") << name;
    EXPECT_TRUE(call["arguments"].is_object());
  }
}

TEST(ForcedJson, JsonObjectAnswer) {
  double step_ms = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    JsonConstraint c;
    c.end_tokens = eos();
    c.max_tokens = 25;
    const std::string text = text_of(generate(make_json_logits_processor(texts(), c), 25, seed, &step_ms));
    EXPECT_TRUE(nlohmann::json::parse(text, nullptr, false).is_object()) << text;
  }
  // Not a timed assertion: what one step costs over a 151669-id vocabulary on this machine.
  std::printf("forced JSON: median %.2f ms per step (vocab %lld)\n", step_ms,
              static_cast<long long>(tokenizer().vocab_size()));
}

TEST(ForcedJson, TokenTextsCoverTheVocabulary) {
  const TokenTexts& t = *texts();
  ASSERT_EQ(t.text.size(), static_cast<size_t>(tokenizer().vocab_size()));
  const int32_t im_end = eos()[0];
  EXPECT_TRUE(t.special[im_end]);
  size_t bucketed = 0;
  for (const auto& b : t.by_first_byte) bucketed += b.size();
  EXPECT_GT(bucketed, 2000u);
  const auto brace = tokenizer().token_to_id("{");
  ASSERT_TRUE(brace.has_value());
  EXPECT_EQ(t.text[*brace], "{");
  EXPECT_NE(std::find(t.by_first_byte['{'].begin(), t.by_first_byte['{'].end(), *brace),
            t.by_first_byte['{'].end());
}

TEST(ThinkingBudget, ForcesTheCloseTokenOnceSpent) {
  const int32_t close = *tokenizer().token_to_id("</think>");
  const LogitsProcessor p = make_thinking_budget_processor(close, 3);
  std::vector<float> logits(10 + static_cast<size_t>(close), 0.f);
  std::vector<int32_t> generated = {1, 2};
  p(logits, generated);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float l) { return l == 0.f; }));
  generated.push_back(3);
  p(logits, generated);
  for (size_t i = 0; i < logits.size(); ++i)
    EXPECT_EQ(std::isinf(logits[i]), static_cast<int32_t>(i) != close);
  std::fill(logits.begin(), logits.end(), 0.f);
  generated = {1, close, 2, 3, 4};
  p(logits, generated);
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float l) { return l == 0.f; }));
}

}  // namespace
}  // namespace xmoe::serve
