// `xmoe init-model` end to end: the written checkpoint reopens through Checkpoint::open with exactly the
// tensors transformers expects (names and shapes from tools/make_checkpoint_fixtures.py), in both expert
// layouts and sharded; values are deterministic, N(0, 0.02) with unit norms, the same model in every layout
// and dtype; the tokenizer files have the structure HF tokenizers needs; bad arguments fail clearly.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "llm/checkpoint.hpp"
#include "xmoe/dtype.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using xmoe::llm::Checkpoint;
using xmoe::testing_cli::run_cli;

const std::string kData = std::string(XMOE_TEST_DATA_DIR) + "/checkpoints/";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/xmoe_init_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  return json::parse(read_text(path));
}

void write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(1);
}

// Runs init-model on `config` into dir/out; returns the output directory.
std::string init_model(const TempDir& dir, const json& config, const std::string& out,
                       const std::string& flags) {
  write_json(dir / (out + ".config.json"), config);
  const auto r =
      run_cli("init-model --config " + dir / (out + ".config.json") + " --out " + dir / out + " " + flags);
  EXPECT_EQ(r.code, 0) << r.output;
  return dir / out;
}

std::vector<float> values(const Checkpoint& c, const std::string& name) {
  const auto w = c.weight(name);
  std::vector<float> v(static_cast<size_t>(w.numel()));
  w.to_f32(0, w.numel(), v.data());
  return v;
}

std::map<std::string, std::vector<int64_t>> expected_tensors(const std::string& layout) {
  return read_json(kData + "tiny_tensors.json")[layout].get<std::map<std::string, std::vector<int64_t>>>();
}

void expect_exact_tensor_set(const Checkpoint& c,
                             const std::map<std::string, std::vector<int64_t>>& expected) {
  std::vector<std::string> names;
  for (const auto& [name, shape] : expected) {
    names.push_back(name);
    EXPECT_NO_THROW(c.weight(name, shape)) << name;  // present, supported dtype, transformers' shape
  }
  EXPECT_EQ(c.tensor_names(), names);
}

TEST(InitModel, PerExpertLayoutHasTransformersTensors) {
  TempDir dir;
  const json config = read_json(kData + "tiny_config.json");
  const std::string out = init_model(dir, config, "m", "--dtype f32 --seed 7");
  const Checkpoint c = Checkpoint::open(out);
  expect_exact_tensor_set(c, expected_tensors("per-expert"));
  EXPECT_EQ(c.config().num_experts, 8);
  EXPECT_EQ(c.weight("model.embed_tokens.weight").dtype, xmoe::llm::TensorDType::f32);
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));

  // Norms are 1 and biases 0, as transformers initialises them; weights N(0, 0.02).
  for (const auto& name : c.tensor_names()) {
    const std::vector<float> v = values(c, name);
    if (name.find("norm") != std::string::npos) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.0f; })) << name;
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; })) << name;
    }
  }
  const std::vector<float> emb = values(c, "model.embed_tokens.weight");  // 19200 values
  double sum = 0, sq = 0;
  for (float x : emb) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double mean = sum / emb.size(), sd = std::sqrt(sq / emb.size() - mean * mean);
  EXPECT_LT(std::abs(mean), 6 * 0.02 / std::sqrt(emb.size()));
  EXPECT_NEAR(sd, 0.02, 0.001);
  // Different tensors draw different streams.
  EXPECT_NE(values(c, "model.layers.0.self_attn.q_proj.weight")[0],
            values(c, "model.layers.0.self_attn.k_proj.weight")[0]);
  EXPECT_NE(values(c, "model.layers.0.mlp.experts.0.up_proj.weight"),
            values(c, "model.layers.0.mlp.experts.1.up_proj.weight"));

  // config.json: the input's fields, the dtype, and the tokenizer's special ids.
  const json written = read_json(out + "/config.json");
  EXPECT_EQ(written["torch_dtype"], "float32");
  EXPECT_EQ(written["vocab_size"], 300);
  EXPECT_EQ(written["mlp_only_layers"], json::array({1}));
  EXPECT_EQ(written["eos_token_id"], 295);  // <|im_end|>: third of the 7 special tokens at the top ids
  const json gen = read_json(out + "/generation_config.json");
  EXPECT_EQ(gen["eos_token_id"][0], 295);
}

TEST(InitModel, FusedLayoutHoldsTheSameModel) {
  TempDir dir;
  const json config = read_json(kData + "tiny_config.json");
  const Checkpoint per = Checkpoint::open(init_model(dir, config, "per", "--dtype f32 --seed 3"));
  const Checkpoint fused =
      Checkpoint::open(init_model(dir, config, "fused", "--dtype f32 --seed 3 --expert-layout fused"));
  expect_exact_tensor_set(fused, expected_tensors("fused"));
  const int64_t E = 8, I = 32, H = 64;
  for (int layer : {0, 2}) {
    const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
    const std::vector<float> gate_up = values(fused, p + "gate_up_proj"),
                             down = values(fused, p + "down_proj");
    for (int64_t j = 0; j < E; ++j) {
      const std::string e = p + std::to_string(j) + ".";
      std::vector<float> expect = values(per, e + "gate_proj.weight");
      const std::vector<float> up = values(per, e + "up_proj.weight");
      expect.insert(expect.end(), up.begin(), up.end());  // transformers: cat([gate, up], dim=1) per expert
      EXPECT_TRUE(std::equal(expect.begin(), expect.end(), gate_up.begin() + j * 2 * I * H)) << e;
      const std::vector<float> d = values(per, e + "down_proj.weight");
      EXPECT_TRUE(std::equal(d.begin(), d.end(), down.begin() + j * H * I)) << e;
    }
  }
  for (const auto& name : per.tensor_names()) {
    if (name.find(".experts.") == std::string::npos) {
      EXPECT_EQ(values(per, name), values(fused, name)) << name;
    }
  }
}

TEST(InitModel, Bf16IsTheF32ModelRounded) {
  TempDir dir;
  const json config = read_json(kData + "tiny_config.json");
  const Checkpoint f32 = Checkpoint::open(init_model(dir, config, "f32", "--dtype f32 --seed 11"));
  const Checkpoint bf16 =
      Checkpoint::open(init_model(dir, config, "bf16", "--seed 11"));  // bf16 is the default
  EXPECT_EQ(read_json(dir / "bf16/config.json")["torch_dtype"], "bfloat16");
  ASSERT_EQ(f32.tensor_names(), bf16.tensor_names());
  for (const auto& name : f32.tensor_names()) {
    const auto w = bf16.weight(name);
    ASSERT_EQ(w.dtype, xmoe::llm::TensorDType::bf16) << name;
    std::vector<uint16_t> stored(static_cast<size_t>(w.numel()));
    std::memcpy(stored.data(), w.bytes.data(), w.bytes.size());
    std::vector<uint16_t> rounded(stored.size());
    f32.weight(name).to_bf16(0, w.numel(), rounded.data());
    EXPECT_EQ(stored, rounded) << name;
  }
}

TEST(InitModel, DeterministicForSeedAndThreadCount) {
  TempDir dir;
  const json config = read_json(kData + "tiny_config.json");
  ::setenv("OMP_NUM_THREADS", "1", 1);
  init_model(dir, config, "t1", "--seed 5");
  ::setenv("OMP_NUM_THREADS", "2", 1);
  init_model(dir, config, "t2", "--seed 5");
  ::unsetenv("OMP_NUM_THREADS");
  init_model(dir, config, "s6", "--seed 6");
  const std::string a = read_text(dir / "t1/model.safetensors"), b = read_text(dir / "t2/model.safetensors");
  ASSERT_GT(a.size(), 100000u);
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == read_text(dir / "s6/model.safetensors"));
  EXPECT_EQ(read_text(dir / "t1/tokenizer.json"), read_text(dir / "s6/tokenizer.json"));
}

TEST(InitModel, ShardsWithIndex) {
  TempDir dir;
  json config = read_json(kData + "tiny_config.json");
  config["vocab_size"] = 4096;  // embed_tokens and lm_head are 1 MiB each in f32
  const std::string one = init_model(dir, config, "one", "--dtype f32");
  const std::string out = init_model(dir, config, "sharded", "--dtype f32 --shard-size-mb 1");
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  const json index = read_json(out + "/model.safetensors.index.json");
  std::set<std::string> shard_files;
  for (const auto& [name, file] : index["weight_map"].items()) shard_files.insert(file.get<std::string>());
  EXPECT_GE(shard_files.size(), 3u);
  size_t total = 0;
  for (const auto& f : shard_files) {
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
    EXPECT_NE(f.find("-of-0000"), std::string::npos) << f;
    // A shard over the limit may hold only one (oversized) tensor; none here is over 1 MiB.
    EXPECT_LE(fs::file_size(out + "/" + f), (1u << 20) + 16384) << f;
  }
  const Checkpoint sharded = Checkpoint::open(out), single = Checkpoint::open(one);
  EXPECT_EQ(sharded.tensor_names(), single.tensor_names());
  for (const auto& name : single.tensor_names()) {
    total += sharded.weight(name).bytes.size();
    EXPECT_EQ(values(sharded, name), values(single, name)) << name;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(sharded.total_bytes(), total);
}

// The GPT-2 byte-to-unicode table: the 256 single-character tokens every byte-level vocabulary has.
std::set<std::string> byte_level_alphabet() {
  std::set<std::string> s;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int cp = printable ? b : 256 + extra++;
    std::string u;
    if (cp < 0x80) {
      u += static_cast<char>(cp);
    } else {
      u += static_cast<char>(0xC0 | (cp >> 6));
      u += static_cast<char>(0x80 | (cp & 0x3F));
    }
    s.insert(u);
  }
  return s;
}

TEST(InitModel, TokenizerFilesHaveHfStructure) {
  TempDir dir;
  json config = read_json(kData + "tiny_config.json");
  config["vocab_size"] = 1000;
  const std::string out = init_model(dir, config, "m", "");
  const json tok = read_json(out + "/tokenizer.json");
  ASSERT_EQ(tok["model"]["type"], "BPE");
  const json& vocab = tok["model"]["vocab"];
  const json& added = tok["added_tokens"];
  // Every id below vocab_size exactly once: regular tokens, then the special tokens at the top.
  std::vector<int> seen(1000, 0);
  for (const auto& [token, id] : vocab.items()) ++seen.at(id.get<size_t>());
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",  "<think>",
                            "</think>",      "<tool_call>",  "</tool_call>"};
  ASSERT_EQ(added.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(added[i]["content"], specials[i]);
    EXPECT_EQ(added[i]["id"], 993 + i);
    EXPECT_EQ(added[i]["special"], i < 3);  // as Qwen3: think/tool tags are added but not special
    ++seen.at(added[i]["id"].get<size_t>());
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Byte level: all 256 byte tokens, every token spelled in that alphabet.
  const std::set<std::string> alphabet = byte_level_alphabet();
  for (const auto& ch : alphabet) EXPECT_TRUE(vocab.contains(ch)) << ch;
  for (const auto& [token, id] : vocab.items()) {
    for (size_t i = 0; i < token.size();) {
      const size_t len = (static_cast<unsigned char>(token[i]) & 0x80) ? 2 : 1;
      EXPECT_TRUE(alphabet.count(token.substr(i, len))) << token;
      i += len;
    }
  }
  // Merges: "a b" with both parts and their concatenation in the vocabulary, the result of rank r at id 256 +
  // r.
  const json& merges = tok["model"]["merges"];
  ASSERT_EQ(merges.size(), 1000u - 7 - 256);
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string m = merges[r].get<std::string>();
    const size_t space = m.find(' ');
    ASSERT_NE(space, std::string::npos) << m;
    const std::string a = m.substr(0, space), b = m.substr(space + 1);
    ASSERT_TRUE(vocab.contains(a) && vocab.contains(b)) << m;
    ASSERT_TRUE(vocab.contains(a + b)) << m;
    EXPECT_EQ(vocab[a + b], 256 + r) << m;
    EXPECT_LT(vocab[a], vocab[a + b]);
    EXPECT_LT(vocab[b], vocab[a + b]);
  }
  EXPECT_EQ(tok["decoder"]["type"], "ByteLevel");
  const json& pre = tok["pre_tokenizer"]["pretokenizers"];
  EXPECT_EQ(pre[0]["type"], "Split");
  EXPECT_EQ(pre[1]["type"], "ByteLevel");

  const json cfg = read_json(out + "/tokenizer_config.json");
  EXPECT_EQ(cfg["eos_token"], "<|im_end|>");
  EXPECT_EQ(cfg["pad_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["chat_template"].get<std::string>(), read_text(kData + "Qwen-Qwen3-0.6B.jinja"));
  EXPECT_EQ(cfg["added_tokens_decoder"]["995"]["content"], "<|im_end|>");
}

TEST(InitModel, TinyVocabWritesNoTokenizer) {
  TempDir dir;
  json config = read_json(kData + "tiny_config.json");
  config["vocab_size"] = 100;
  write_json(dir / "c.json", config);
  const auto r = run_cli("init-model --config " + dir / "c.json" + " --out " + dir / "m");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("no tokenizer written"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "m/tokenizer.json"));
  EXPECT_NO_THROW(Checkpoint::open(dir / "m"));
}

TEST(InitModel, BadArgumentsFailClearly) {
  TempDir dir;
  write_json(dir / "c.json", read_json(kData + "tiny_config.json"));
  json bad = read_json(kData + "tiny_config.json");
  bad["num_key_value_heads"] = 3;
  write_json(dir / "bad.json", bad);
  std::ofstream(dir / "broken.json") << "{\"model_type\": ";
  json huge = read_json(kData + "tiny_config.json");
  huge["hidden_size"] = int64_t{1} << 36;
  huge["vocab_size"] = 1 << 30;
  write_json(dir / "huge.json", huge);
  json big = read_json(kData + "tiny_config.json");
  big["hidden_size"] = 1 << 20;  // valid, but ~4 TB: more than any disk here
  big["vocab_size"] = 1 << 20;
  write_json(dir / "big.json", big);
  fs::create_directories(dir / "full");
  std::ofstream(dir / "full/x") << "x";
  const std::string c = " --config " + dir / "c.json";
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"init-model --out " + dir / "o", "--config is required"},
      {"init-model" + c, "--out is required"},
      {"init-model" + c + " --out " + dir / "o" + " --dtype f16", "--dtype"},
      {"init-model" + c + " --out " + dir / "o" + " --expert-layout stacked", "--expert-layout"},
      {"init-model" + c + " --out " + dir / "o" + " --shard-size-mb 0", "must be a positive integer"},
      {"init-model" + c + " --out " + dir / "o" + " --seed -4", "must be an integer >= 0"},
      {"init-model --config " + dir / "none.json" + " --out " + dir / "o", "none.json"},
      {"init-model --config " + dir / "bad.json" + " --out " + dir / "o", "field 'num_key_value_heads'"},
      {"init-model --config " + dir / "broken.json" + " --out " + dir / "o", "malformed JSON at byte"},
      {"init-model --config " + dir / "huge.json" + " --out " + dir / "o", "would be too large"},
      {"init-model --config " + dir / "big.json" + " --out " + dir / "big", "GB free"},
      {"init-model" + c + " --out " + dir / "full", "is not empty"},
      {"init-model" + c + " --out " + dir / "c.json", "not a directory"},
  };
  for (const auto& k : cases) {
    const auto r = run_cli(k.args);
    EXPECT_NE(r.code, 0) << k.args << "\n" << r.output;
    EXPECT_NE(r.output.find(k.says), std::string::npos) << k.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "o"));  // nothing written for a rejected config
}

}  // namespace
