#include "byte_level_tokenizer_writer.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

using json = nlohmann::ordered_json;

using llm::SpecialTokenSpec;

// Common English and code words: the first merges build them (with and without a leading space) so that
// ordinary text encodes to fewer tokens than bytes, as with a trained vocabulary.
constexpr const char* kSeedWords =
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their can has more will would if been what when so no who up out "
    "about into than them only other its time new some could these two may first then do any like my now "
    "over "
    "such our man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three hello world model token expert "
    "mixture layer hidden attention router weight value question answer think tool call user assistant "
    "system "
    "def return class import from self None True False int float str list dict print range len for while if "
    "else elif try except with lambda yield async await const auto void struct include namespace std vector "
    "string template typename public private static inline function var let null undefined";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to code points from U+0100 up.
std::vector<std::string> byte_tokens_in_vocab_order(std::vector<int>& byte_of_token) {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  std::vector<bool> used(256, false);
  for (int b : bs) used[static_cast<size_t>(b)] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (!used[static_cast<size_t>(b)]) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  std::vector<std::string> tokens;
  for (int cp : cs) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    tokens.push_back(s);
  }
  byte_of_token = bs;
  return tokens;
}

// Splits a byte-level string into its code points (each one byte token).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = (static_cast<unsigned char>(s[i]) & 0x80) ? 2 : 1;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

struct Bpe {
  std::vector<std::string> vocab;  // by id
  std::vector<std::pair<std::string, std::string>> merges;
  std::unordered_set<std::string> known;

  // By value: a and b may be elements of vocab, which push_back reallocates.
  bool add_merge(std::string a, std::string b) {
    const std::string merged = a + b;
    if (known.count(merged)) return false;
    known.insert(merged);
    vocab.push_back(merged);
    merges.emplace_back(std::move(a), std::move(b));
    return true;
  }
};

Bpe build_bpe(int64_t num_regular, const std::vector<SpecialTokenSpec>& specials) {
  std::vector<int> byte_of_token;
  Bpe bpe;
  bpe.vocab = byte_tokens_in_vocab_order(byte_of_token);
  for (const auto& t : bpe.vocab) bpe.known.insert(t);
  for (const auto& s : specials) bpe.known.insert(s.content);  // never shadow an added token
  const size_t target = static_cast<size_t>(num_regular);
  const std::string space = "\xC4\xA0";  // Ġ, the byte-level form of ' '

  // Words left to right, so each merge joins an existing token with one more byte token.
  std::istringstream words(kSeedWords);
  std::string word;
  while (bpe.vocab.size() < target && words >> word) {
    for (const std::string& form : {space + word, word}) {
      const std::vector<std::string> cps = code_points(form);
      std::string prefix = cps[0];
      for (size_t i = 1; i < cps.size() && bpe.vocab.size() < target; ++i) {
        bpe.add_merge(prefix, cps[i]);
        prefix += cps[i];
      }
    }
  }
  // Then every token extended by every byte token, breadth first, until the vocabulary is full.
  for (size_t base = 0; bpe.vocab.size() < target; ++base)
    for (size_t b = 0; b < 256 && bpe.vocab.size() < target; ++b)
      bpe.add_merge(bpe.vocab[base], bpe.vocab[b]);
  return bpe;
}

std::string quoted(const std::string& s) {
  return json(s).dump();
}

json added_token_json(int64_t id, const SpecialTokenSpec& t) {
  json j;
  j["id"] = id;
  j.update(added_token_entry(t));
  return j;
}

}  // namespace

json added_token_entry(const SpecialTokenSpec& t) {
  json j;
  j["content"] = t.content;
  j["single_word"] = false;
  j["lstrip"] = false;
  j["rstrip"] = false;
  j["normalized"] = false;
  j["special"] = t.special;
  return j;
}

std::vector<std::string> byte_level_vocabulary(int64_t num_regular,
                                               const std::vector<SpecialTokenSpec>& specials) {
  return build_bpe(num_regular, specials).vocab;
}

json tokenizer_config_json(const llm::InitModelSpec& spec, json added_tokens_decoder) {
  json config;
  config["add_bos_token"] = false;
  config["add_prefix_space"] = false;
  config["added_tokens_decoder"] = std::move(added_tokens_decoder);
  config["additional_special_tokens"] = spec.additional_special_tokens;
  config["bos_token"] = spec.bos_token.empty() ? json(nullptr) : json(spec.bos_token);
  config["chat_template"] = spec.chat_template;
  config["clean_up_tokenization_spaces"] = false;
  config["eos_token"] = spec.eos_token;
  config["errors"] = "replace";
  config["model_max_length"] = spec.model_max_length;
  config["pad_token"] = spec.pad_token;
  config["split_special_tokens"] = false;
  config["tokenizer_class"] = spec.tokenizer_class;
  config["unk_token"] = nullptr;
  return config;
}

std::map<std::string, int32_t> write_byte_level_tokenizer(const std::string& dir, int64_t vocab_size,
                                                          const llm::InitModelSpec& spec) {
  const int64_t min_vocab = min_byte_level_vocab(spec);
  XMOE_CHECK(vocab_size >= min_vocab, "tokenizer: vocab_size ", vocab_size,
             " is too small for a byte-level tokenizer (needs >= ", min_vocab, ")");
  const auto num_special = static_cast<int64_t>(spec.special_tokens.size());
  const int64_t first_special = vocab_size - num_special;
  const Bpe bpe = build_bpe(first_special, spec.special_tokens);

  json head;
  head["version"] = "1.0";
  head["truncation"] = nullptr;
  head["padding"] = nullptr;
  json added = json::array();
  for (int64_t i = 0; i < num_special; ++i)
    added.push_back(added_token_json(first_special + i, spec.special_tokens[static_cast<size_t>(i)]));
  head["added_tokens"] = added;
  head["normalizer"] = {{"type", "NFC"}};
  head["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers", json::array({{{"type", "Split"},
                                                           {"pattern", {{"Regex", spec.split_regex}}},
                                                           {"behavior", "Isolated"},
                                                           {"invert", false}},
                                                          {{"type", "ByteLevel"},
                                                           {"add_prefix_space", false},
                                                           {"trim_offsets", false},
                                                           {"use_regex", false}}})}};
  head["post_processor"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  head["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};

  // The vocabulary and merges are large (150k entries at Qwen3's size): written by hand rather than through a
  // JSON object, whose ordered inserts are quadratic.
  std::string text = head.dump(1);
  text.resize(text.rfind('}'));  // reopen the object to append "model"
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  text +=
      ",\n \"model\": {\n  \"type\": \"BPE\",\n  \"dropout\": null,\n  \"unk_token\": null,\n"
      "  \"continuing_subword_prefix\": \"\",\n  \"end_of_word_suffix\": \"\",\n  \"fuse_unk\": false,\n"
      "  \"byte_fallback\": false,\n  \"ignore_merges\": false,\n  \"vocab\": {";
  for (size_t id = 0; id < bpe.vocab.size(); ++id)
    text += (id ? ",\n   " : "\n   ") + quoted(bpe.vocab[id]) + ": " + std::to_string(id);
  text += "\n  },\n  \"merges\": [";
  for (size_t i = 0; i < bpe.merges.size(); ++i)
    text += (i ? ",\n   " : "\n   ") + quoted(bpe.merges[i].first + " " + bpe.merges[i].second);
  text += "\n  ]\n }\n}\n";
  write_text_file(dir + "/tokenizer.json", text);

  json decoder = json::object();
  for (int64_t i = 0; i < num_special; ++i)
    decoder[std::to_string(first_special + i)] =
        added_token_entry(spec.special_tokens[static_cast<size_t>(i)]);
  const json config = tokenizer_config_json(spec, std::move(decoder));
  write_text_file(dir + "/tokenizer_config.json", config.dump(2) + "\n");

  std::map<std::string, int32_t> ids;
  for (int64_t i = 0; i < num_special; ++i)
    ids[spec.special_tokens[static_cast<size_t>(i)].content] = static_cast<int32_t>(first_special + i);
  return ids;
}

}  // namespace xmoe::app
