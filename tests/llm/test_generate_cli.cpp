// `xmoe generate` as a user runs it: greedy ids against transformers' (tests/data/models, made by
// tools/make_fixtures.py), text generation end to end on a checkpoint made by `xmoe init-model`, and errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "io/page_cache.hpp"
#include "llm/chat_setup.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"
#include "xmoe/tokenizer.hpp"

namespace {

using xmoe::testing_cli::run_cli;
namespace fs = std::filesystem;

const std::string kModels = std::string(XMOE_TEST_DATA_DIR) + "/models";

// "p{index}{what}" (built by appending: GCC 12 warns falsely on "literal" + std::string temporaries).
std::string tensor_key(int index, const char* what) {
  std::string key = "p";
  key += std::to_string(index);
  key += what;
  return key;
}

std::vector<int32_t> i32_tensor(const xmoe::SafetensorsFile& f, const std::string& name) {
  const auto bytes = f.bytes(name);
  std::vector<int32_t> v(bytes.size() / sizeof(int32_t));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

// The ids after "generated ids: " in the CLI's output.
std::string generated_ids(const std::string& output) {
  const std::string key = "generated ids: ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return "<none>";
  return output.substr(at + key.size(), output.find('\n', at) - at - key.size());
}

TEST(GenerateCli, GreedyIdsMatchTransformers) {
  for (const std::string name : {"untied-yarn", "tied-sparse"}) {
    const auto expected = xmoe::SafetensorsFile::open(kModels + "/" + name + ".expected.safetensors");
    for (int p = 0; p < 3; ++p) {
      SCOPED_TRACE(name + " p" + std::to_string(p));
      const auto prompt = i32_tensor(expected, tensor_key(p, ".prompt"));
      const auto greedy = i32_tensor(expected, tensor_key(p, ".greedy"));
      const auto r = run_cli("generate --model " + kModels + "/" + name + " --prompt-ids " + join(prompt) +
                             " --max-tokens " + std::to_string(greedy.size()) +
                             " --temperature 0 --ignore-eos --dtype f32 --print-ids --prefill-chunk 4");
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_EQ(generated_ids(r.output), join(greedy)) << r.output;
      EXPECT_NE(r.output.find("prefill: " + std::to_string(prompt.size()) + " tokens"), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("tokens/s"), std::string::npos);
      EXPECT_NE(r.output.find("weights read per decoded token"), std::string::npos);
    }
  }
}

TEST(GenerateCli, BatchOfTheSamePromptReportsAggregateDecode) {
  const auto expected = xmoe::SafetensorsFile::open(kModels + "/untied-yarn.expected.safetensors");
  const auto r = run_cli("generate --model " + kModels + "/untied-yarn --prompt-ids " +
                         join(i32_tensor(expected, "p1.prompt")) +
                         " --max-tokens 8 --temperature 0 --ignore-eos --dtype f32 --print-ids --batch 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(generated_ids(r.output), join(i32_tensor(expected, "p1.greedy")));
  EXPECT_NE(r.output.find("prompt 11 tokens x 3 sequences"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s aggregate"), std::string::npos) << r.output;
  // Three copies of one prompt choose the same experts: a step reads what one sequence does (plus two
  // embedding rows, well under the printed precision).
  double step_mb = 0, single_mb = 0;
  const size_t at = r.output.find("weights read per decode step: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(std::sscanf(r.output.c_str() + at, "weights read per decode step: %lf MB (%lf MB at batch 1)",
                        &step_mb, &single_mb),
            2)
      << r.output;
  EXPECT_GT(single_mb, 0.0);
  EXPECT_NEAR(step_mb, single_mb, 0.0100001) << r.output;
}

TEST(GenerateCli, PrefaultIsReportedAndAnUnknownModeRefused) {
  const std::string base = "generate --model " + kModels +
                           "/untied-yarn --prompt-ids 1,2,3 --max-tokens 2 "
                           "--temperature 0 --dtype f32 --print-ids --measure-bandwidth --prefault ";
  const auto on = run_cli(base + "on");
  ASSERT_EQ(on.code, 0) << on.output;
  // A kernel without MADV_POPULATE_READ says so instead (and decodes all the same).
  EXPECT_TRUE(on.output.find("; weights prefaulted: ") != std::string::npos ||
              on.output.find("weights prefaulted only in part") != std::string::npos)
      << on.output;
  // Its one decode step is also compared with the read probes run beside it, which change nothing decoded.
  EXPECT_NE(on.output.find("decode against a read probe between steps (1 steps; probes "), std::string::npos)
      << on.output;
  const auto off = run_cli(base + "off");
  ASSERT_EQ(off.code, 0) << off.output;
  EXPECT_NE(off.output.find("; weights not prefaulted: --prefault off"), std::string::npos) << off.output;
  EXPECT_EQ(generated_ids(on.output), generated_ids(off.output));
  const std::string unmeasured = base.substr(0, base.find(" --measure-bandwidth"));
  const auto plain = run_cli(unmeasured);
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_EQ(plain.output.find("read probe between steps"), std::string::npos) << plain.output;
  EXPECT_EQ(generated_ids(plain.output), generated_ids(on.output));
  const auto bad = run_cli(base + "sometimes");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--prefault"), std::string::npos) << bad.output;
  // Reading the files again into 2 MiB pages changes where the bytes sit, not what they are.
  const auto reread = run_cli(base + "on --page-cache reload");
  ASSERT_EQ(reread.code, 0) << reread.output;
  EXPECT_EQ(generated_ids(reread.output), generated_ids(on.output));
  const auto bad_cache = run_cli(base + "on --page-cache sometimes");
  EXPECT_NE(bad_cache.code, 0);
  EXPECT_NE(bad_cache.output.find("--page-cache"), std::string::npos) << bad_cache.output;
}

TEST(GenerateCli, SeededSamplingDoesNotDependOnThreadsOrBatch) {
  const auto expected = xmoe::SafetensorsFile::open(kModels + "/untied-yarn.expected.safetensors");
  const std::string base = "generate --model " + kModels + "/untied-yarn --prompt-ids " +
                           join(i32_tensor(expected, tensor_key(2, ".prompt"))) +
                           " --max-tokens 12 --temperature 1.2 --top-k 50 --seed 11 --ignore-eos --print-ids";
  const auto one = run_cli(base + " --threads 1");
  const auto two = run_cli(base + " --threads 2 --batch 3 --prefill-chunk 5");
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_EQ(generated_ids(one.output), generated_ids(two.output));
  const auto other_seed = run_cli(base + " --threads 1 --seed 12");
  EXPECT_NE(generated_ids(other_seed.output), generated_ids(one.output));
}

// "sequence {i} generated ids: " lines of a run with several sequences.
std::string sequence_ids(const std::string& output, int i) {
  return generated_ids(output.substr(output.find("sequence " + std::to_string(i) + " generated ids: ")));
}

TEST(GenerateCli, SeveralPromptsDecodeTogetherEachAsAlone) {
  // Greedy: each sequence gives transformers' ids for its own prompt, whatever else is in the batch.
  const auto expected = xmoe::SafetensorsFile::open(kModels + "/untied-yarn.expected.safetensors");
  std::vector<std::vector<int32_t>> greedy;
  std::string prompts;
  size_t steps = SIZE_MAX;
  for (int p = 0; p < 3; ++p) {
    greedy.push_back(i32_tensor(expected, tensor_key(p, ".greedy")));
    steps = std::min(steps, greedy.back().size());
    prompts += " --prompt-ids " + join(i32_tensor(expected, tensor_key(p, ".prompt")));
  }
  const std::string base = "generate --model " + kModels + "/untied-yarn" + prompts +
                           " --ignore-eos --dtype f32 --print-ids --threads 2 --max-tokens ";
  const auto r = run_cli(base + std::to_string(steps) + " --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 prompts"), std::string::npos) << r.output;
  for (int p = 0; p < 3; ++p) {
    greedy[p].resize(steps);
    EXPECT_EQ(sequence_ids(r.output, p), join(greedy[p])) << r.output;
    EXPECT_NE(r.output.find("--- sequence " + std::to_string(p) + " (prompt " + std::to_string(p)),
              std::string::npos)
        << r.output;
  }
  // Sampling: sequence i uses seed + i, so it equals prompt i alone with that seed; --batch 4 repeats prompt
  // 0 as sequence 3 with its own seed.
  const auto sampled = run_cli(base + "10 --temperature 1 --seed 20 --batch 4");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    const auto alone =
        run_cli("generate --model " + kModels + "/untied-yarn --prompt-ids " +
                join(i32_tensor(expected, tensor_key(i % 3, ".prompt"))) +
                " --ignore-eos --dtype f32 --print-ids --threads 1 --max-tokens 10 --temperature 1 "
                "--seed " +
                std::to_string(20 + i));
    ASSERT_EQ(alone.code, 0) << alone.output;
    EXPECT_EQ(sequence_ids(sampled.output, i), generated_ids(alone.output));
  }
  EXPECT_NE(sequence_ids(sampled.output, 3), sequence_ids(sampled.output, 0));  // same prompt, other seed
}

// A checkpoint just written sits in the page cache in small pages; --page-cache reload drops it and reads it
// again (into 2 MiB pages where the kernel can), and decodes the same ids as the pages it had.
TEST(GenerateCli, PageCacheReloadReadsAJustWrittenCheckpointAgain) {
  const std::string dir =
      (fs::temp_directory_path() / ("xmoe_page_cache_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(kModels + "/untied-yarn/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["vocab_size"] = 32768;  // embeddings and lm_head of 8 MiB each in f32: whole 2 MiB blocks
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  const auto made =
      run_cli("init-model --config " + dir + "/config.json --out " + dir + "/model --dtype f32");
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string base = "generate --model " + dir +
                           "/model --prompt-ids 1,2,3 --max-tokens 3 --temperature 0 --dtype f32 --print-ids "
                           "--measure-bandwidth --prefault on --page-cache ";
  const auto kept = run_cli(base + "keep");
  ASSERT_EQ(kept.code, 0) << kept.output;
  EXPECT_NE(kept.output.find(" in 2 MiB pages"), std::string::npos) << kept.output;
  EXPECT_EQ(kept.output.find("read again in"), std::string::npos) << kept.output;
  const auto reread = run_cli(base + "reload");
  ASSERT_EQ(reread.code, 0) << reread.output;
  if (xmoe::io::transparent_huge_pages_enabled()) {
    EXPECT_NE(reread.output.find("read again in"), std::string::npos) << reread.output;
  }
  EXPECT_EQ(generated_ids(reread.output), generated_ids(kept.output));
  fs::remove_all(dir);
}

// A random-weight checkpoint with a byte-level tokenizer and the Qwen3 chat template, made once per run.
class GenerateCliText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("xmoe_generate_cli_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ifstream in(kModels + "/untied-yarn/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["vocab_size"] = 300;  // room for the 256 byte tokens and the special tokens
    std::ofstream(dir_ + "/config.json") << cfg.dump(2);
    const auto r =
        run_cli("init-model --config " + dir_ + "/config.json --out " + dir_ + "/model --dtype f32");
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string model() { return dir_ + "/model"; }
  // What the command printed to stdout: between the loading summary line and the report.
  static std::string stdout_text(const std::string& output) {
    const size_t start = output.find('\n', output.find("loading ")) + 1;
    return output.substr(start, output.find("\nmodel: ") - start);
  }
  static inline std::string dir_;
};

TEST_F(GenerateCliText, StreamsTextAndNoStreamPrintsTheSame) {
  const std::string args = "generate --model " + model() +
                           " --prompt 'Hello, world' --max-tokens 6 --seed 3 "
                           "--ignore-eos --dtype f32 --print-ids";
  const auto streamed = run_cli(args);
  ASSERT_EQ(streamed.code, 0) << streamed.output;
  const auto once = run_cli(args + " --no-stream");
  ASSERT_EQ(once.code, 0) << once.output;
  EXPECT_EQ(generated_ids(streamed.output), generated_ids(once.output));
  const std::string ids = generated_ids(streamed.output);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ','), 5) << ids;
  EXPECT_NE(streamed.output.find("finish: length after 6 tokens"), std::string::npos) << streamed.output;
  EXPECT_EQ(stdout_text(streamed.output), stdout_text(once.output));
  // The streamed pieces add up to the tokenizer's decode of the ids (special tokens skipped).
  const xmoe::Tokenizer tokenizer = xmoe::Tokenizer::from_file(model() + "/tokenizer.json");
  std::vector<int32_t> id_list;
  for (size_t pos = 0; pos < ids.size();) {
    const size_t comma = std::min(ids.find(',', pos), ids.size());
    id_list.push_back(std::stoi(ids.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  EXPECT_EQ(stdout_text(streamed.output), tokenizer.decode(id_list, /*skip_special_tokens=*/true));
  EXPECT_FALSE(stdout_text(streamed.output).empty());
  // Another seed samples something else (generation_config.json: temperature 0.6, top-k 20, top-p 0.95).
  const auto other = run_cli("generate --model " + model() +
                             " --prompt 'Hello, world' --max-tokens 6 --seed 4 "
                             "--ignore-eos --dtype f32 --print-ids");
  EXPECT_NE(generated_ids(other.output), generated_ids(streamed.output));
}

TEST_F(GenerateCliText, PromptsFileGivesOneSequencePerLine) {
  const std::string file = dir_ + "/prompts.txt";
  std::ofstream(file) << "Hello, world\r\nThe second prompt\nthree\n";
  const std::string common = " --max-tokens 4 --ignore-eos --dtype f32 --no-stream";
  const auto r = run_cli("generate --model " + model() + " --prompts-file " + file + " --seed 7" + common);
  ASSERT_EQ(r.code, 0) << r.output;
  const char* lines[] = {"Hello, world", "The second prompt", "three"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const auto alone = run_cli("generate --model " + model() + " --prompt '" + lines[i] + "' --seed " +
                               std::to_string(7 + i) + common);
    ASSERT_EQ(alone.code, 0) << alone.output;
    // The block after this sequence's header holds what the prompt alone prints.
    const std::string header =
        "--- sequence " + std::to_string(i) + " (prompt " + std::to_string(i) + ", 4 tokens";
    const size_t at = r.output.find(header);
    ASSERT_NE(at, std::string::npos) << r.output;
    const size_t text = r.output.find('\n', at) + 1;
    EXPECT_EQ(r.output.substr(text, r.output.find('\n', text) - text), stdout_text(alone.output));
  }
  // A --prompt comes before the file's lines.
  const auto both =
      run_cli("generate --model " + model() + " --prompt first --prompts-file " + file + common);
  ASSERT_EQ(both.code, 0) << both.output;
  EXPECT_NE(both.output.find("--- sequence 3 (prompt 3"), std::string::npos) << both.output;

  std::ofstream(dir_ + "/blank.txt") << "one\n\nthree\n";
  const auto blank =
      run_cli("generate --model " + model() + " --prompts-file " + dir_ + "/blank.txt" + common);
  EXPECT_EQ(blank.code, 2);
  EXPECT_NE(blank.output.find("line 2 is blank"), std::string::npos) << blank.output;
  const auto few = run_cli("generate --model " + model() + " --prompts-file " + file + " --batch 2" + common);
  EXPECT_EQ(few.code, 2);
  EXPECT_NE(few.output.find("--batch 2 is fewer sequences than the 3 prompts"), std::string::npos)
      << few.output;
}

TEST_F(GenerateCliText, ChatTemplateAndStopToken) {
  const std::string chat = "generate --model " + model() +
                           " --chat --system 'Be brief.' --prompt 'Hi there' --no-think --max-tokens 5 "
                           "--temperature 0 --ignore-eos --print-ids --dtype f32";
  const auto r = run_cli(chat);
  ASSERT_EQ(r.code, 0) << r.output;
  // The chat prompt is longer than the bare one by the template's markup.
  const auto bare =
      run_cli("generate --model " + model() + " --prompt 'Hi there' --max-tokens 1 --dtype f32");
  ASSERT_EQ(bare.code, 0) << bare.output;
  auto prompt_tokens = [](const std::string& out) {
    const size_t at = out.find("; prompt ");
    return at == std::string::npos ? -1 : std::stoi(out.substr(at + 9));
  };
  EXPECT_GT(prompt_tokens(r.output), prompt_tokens(bare.output) + 10) << r.output << bare.output;

  const std::string ids = generated_ids(r.output);
  const std::string third = ids.substr(0, ids.find(',', ids.find(',', ids.find(',') + 1) + 1));
  const std::string stop_id = third.substr(third.rfind(',') + 1);
  const auto stopped = run_cli(chat + " --stop-id " + stop_id);
  ASSERT_EQ(stopped.code, 0) << stopped.output;
  const std::string got = generated_ids(stopped.output);
  EXPECT_EQ(ids.substr(0, got.size()), got);
  EXPECT_LE(std::count(got.begin(), got.end(), ','), 2);
  EXPECT_NE(stopped.output.find("finish: stop"), std::string::npos) << stopped.output;
}

// GLM-4.7-Flash's published template ends the generation prompt with "<think>": the reply is reasoning until
// "</think>", so nothing of it is answer text (as the server's parser reads it); --show-reasoning prints it,
// and with --no-think (the template writes "</think>" itself) it is the answer. The random model does not
// close the block within the tokens generated (checked), so all of its text is reasoning.
TEST_F(GenerateCliText, PromptThatOpensThinkingMakesTheReplyReasoning) {
  const fs::path template_file = fs::path(model()) / "chat_template.jinja";
  fs::copy_file(std::string(XMOE_TEST_DATA_DIR) + "/chat_templates/GLM-4.7-Flash.jinja", template_file);
  const std::string chat = "generate --model " + model() +
                           " --chat --prompt 'Hi there' --max-tokens 6 --temperature 0 --ignore-eos "
                           "--print-ids --dtype f32";
  const auto thinking = run_cli(chat);
  const auto shown = run_cli(chat + " --show-reasoning");
  const auto answer = run_cli(chat + " --no-think");
  fs::remove(template_file);
  ASSERT_EQ(thinking.code, 0) << thinking.output;
  ASSERT_EQ(shown.code, 0) << shown.output;
  ASSERT_EQ(answer.code, 0) << answer.output;

  const xmoe::Tokenizer tokenizer = xmoe::Tokenizer::from_file(model() + "/tokenizer.json");
  const auto text_of = [&](const std::string& output) {
    const std::string ids = generated_ids(output);
    std::vector<int32_t> id_list;
    for (size_t pos = 0; pos < ids.size();) {
      const size_t comma = std::min(ids.find(',', pos), ids.size());
      id_list.push_back(std::stoi(ids.substr(pos, comma - pos)));
      pos = comma + 1;
    }
    EXPECT_EQ(id_list.size(), 6u) << output;
    return tokenizer.decode(id_list, /*skip_special_tokens=*/false);
  };
  const std::string reasoning = text_of(thinking.output);
  ASSERT_FALSE(reasoning.empty());
  ASSERT_EQ(reasoning.find("</think>"), std::string::npos) << reasoning;
  EXPECT_EQ(stdout_text(thinking.output), "") << thinking.output;
  EXPECT_EQ(generated_ids(shown.output), generated_ids(thinking.output));
  EXPECT_NE(shown.output.find(reasoning), std::string::npos) << shown.output;
  // Thinking off: the reply (another prompt, so other ids) is answer text.
  EXPECT_EQ(stdout_text(answer.output), text_of(answer.output)) << answer.output;
}

TEST(GenerateCliErrors, BadArgumentsAndMissingFilesGiveClearErrors) {
  const std::string model = " --model " + kModels + "/tied-sparse";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"generate --model /nonexistent/xmoe-model --prompt-ids 1,2", "/nonexistent/xmoe-model"},
      {"generate" + model, "--prompt"},
      {"generate" + model + " --prompt hi --prompt-ids 1", "--prompt"},
      {"generate" + model + " --prompt-ids 1,x,3", "'x' is not a token id"},
      {"generate" + model + " --prompt-ids 1,-2", "'-2' is not a token id"},
      {"generate" + model + " --prompt-ids 1,2 --top-p 0", "top_p"},
      {"generate" + model + " --prompt-ids 1,2 --temperature -1", "--temperature"},
      {"generate" + model + " --prompt-ids 1,2 --dtype f16", "--dtype"},
      {"generate" + model + " --prompt-ids 1,2 --max-tokens 0", "--max-tokens"},
      {"generate" + model + " --prompt hello", "tokenizer.json"},
      {"generate" + model + " --prompt-ids 1,2 --chat", "--chat needs --prompt"},
      {"generate" + model + " --prompt-ids 1,256 --dtype f32", "outside the vocabulary"},
      {"generate" + model + " --prompt-ids 1,2 --stop x", "--stop needs"},
      {"generate" + model + " --prompts-file /nonexistent/prompts.txt", "/nonexistent/prompts.txt"},
      {"generate" + model + " --prompt-ids 1,2 --prompt-ids 3 --chat", "--chat needs --prompt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
}

// render_chat_prompt builds the context transformers' apply_chat_template builds (messages,
// add_generation_prompt, enable_thinking only when given, bos/eos tokens): its output must equal Python
// jinja2's on the template fixtures' [system?, user] conversations (tests/data/chat_templates,
// tools/make_template_fixtures.py).
TEST(ChatSetup, RenderedPromptsMatchJinja2) {
  const std::string dir = std::string(XMOE_TEST_DATA_DIR) + "/chat_templates";
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    fs::path cases_path = entry.path();
    cases_path.replace_extension(".json");
    std::ifstream source_in(entry.path()), cases_in(cases_path);
    if (!cases_in.good()) continue;
    const std::string source((std::istreambuf_iterator<char>(source_in)), std::istreambuf_iterator<char>());
    if (source.find("strftime_now") != std::string::npos) continue;  // the date would differ
    const nlohmann::json fixture = nlohmann::json::parse(cases_in);
    for (const auto& c : fixture["cases"]) {
      const nlohmann::json& ctx = c["context"];
      if (!ctx.contains("messages") || !ctx["messages"].is_array() || ctx["messages"].empty()) continue;
      const nlohmann::json& messages = ctx["messages"];
      auto role = [](const nlohmann::json& m) { return m.value("role", std::string()); };
      const bool plain = messages.size() <= 2 && role(messages.back()) == "user" &&
                         (messages.size() == 1 || role(messages[0]) == "system") &&
                         (!ctx.contains("tools") || ctx["tools"].is_null());
      bool strings = true;
      for (const auto& m : messages) strings = strings && m.contains("content") && m["content"].is_string();
      if (!plain || !strings) continue;
      SCOPED_TRACE(entry.path().filename().string() + " " + c["name"].get<std::string>());
      xmoe::llm::ChatSetup setup;
      setup.chat_template = source;
      setup.chat_template_origin = entry.path().string();
      setup.bos_token = ctx.value("bos_token", "");
      setup.eos_token = ctx.value("eos_token", "");
      xmoe::llm::ChatPromptOptions options;
      if (messages.size() == 2) options.system = messages[0]["content"].get<std::string>();
      options.user = messages.back()["content"].get<std::string>();
      options.add_generation_prompt = ctx.value("add_generation_prompt", false);
      if (ctx.contains("enable_thinking")) options.enable_thinking = ctx["enable_thinking"].get<bool>();
      EXPECT_EQ(xmoe::llm::render_chat_prompt(setup, options), c["expected"].get<std::string>());
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

TEST(ChatSetup, ReadsTokenizerConfigTemplateFileAndGenerationConfig) {
  const fs::path dir = fs::temp_directory_path() / ("xmoe_chat_setup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto write = [&](const char* name, const std::string& text) { std::ofstream(dir / name) << text; };
  write("tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<E>", "lstrip": false},
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}]})");
  write("generation_config.json",
        R"({"eos_token_id": [7, 3], "do_sample": false, "top_p": 0.8, "top_k": 5})");
  xmoe::llm::ModelConfig config;
  config.eos_token_ids = {3, 9};
  xmoe::llm::ChatSetup setup = xmoe::llm::load_chat_setup(dir.string(), config, nullptr);
  EXPECT_EQ(setup.chat_template.value_or("<none>"), "D{{ eos_token }}");
  EXPECT_EQ(setup.eos_token, "<E>");
  EXPECT_EQ(setup.bos_token, "");
  EXPECT_EQ(setup.eos_token_ids, (std::vector<int32_t>{3, 9, 7}));
  xmoe::llm::SamplingParams params;
  xmoe::llm::apply_generation_defaults(setup, params);
  EXPECT_EQ(params.temperature, 0.0);  // do_sample false
  EXPECT_EQ(params.top_p, 0.8);
  EXPECT_EQ(params.top_k, 5);
  xmoe::llm::ChatPromptOptions options;
  options.user = "u";
  EXPECT_EQ(xmoe::llm::render_chat_prompt(setup, options), "D<E>");

  write("chat_template.jinja", "J{{ messages[0].content }}");  // the file wins, as in transformers
  setup = xmoe::llm::load_chat_setup(dir.string(), config, nullptr);
  EXPECT_EQ(xmoe::llm::render_chat_prompt(setup, options), "Ju");

  write("generation_config.json", R"({"eos_token_id": "two"})");
  try {
    xmoe::llm::load_chat_setup(dir.string(), config, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("eos_token_id"), std::string::npos) << e.what();
  }
  write("generation_config.json", "{");
  EXPECT_THROW(xmoe::llm::load_chat_setup(dir.string(), config, nullptr), xmoe::Error);
  fs::remove(dir / "generation_config.json");
  fs::remove(dir / "chat_template.jinja");
  fs::remove(dir / "tokenizer_config.json");
  setup = xmoe::llm::load_chat_setup(dir.string(), config, nullptr);
  EXPECT_FALSE(setup.chat_template.has_value());
  EXPECT_THROW(xmoe::llm::render_chat_prompt(setup, options), xmoe::Error);
  fs::remove_all(dir);
}

}  // namespace
