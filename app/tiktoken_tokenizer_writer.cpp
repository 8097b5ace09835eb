#include "tiktoken_tokenizer_writer.hpp"

#include "byte_level_tokenizer_writer.hpp"
#include "llm/tokenizer/byte_level.hpp"
#include "llm/tokenizer/tiktoken_tokenizer.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {
namespace {

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

}  // namespace

std::map<std::string, int32_t> write_tiktoken_tokenizer(const std::string& dir, int64_t vocab_size,
                                                        const llm::InitModelSpec& spec) {
  constexpr int64_t kReserved = tokenizer_detail::kReservedSpecialTokens;
  XMOE_CHECK(vocab_size >= kMinTiktokenVocab, "tokenizer: vocab_size ", vocab_size,
             " is too small for a tiktoken vocabulary (needs >= ", kMinTiktokenVocab,
             ": 256 byte tokens and 256 reserved special ids)");
  XMOE_CHECK(static_cast<int64_t>(spec.special_tokens.size()) <= kReserved,
             "tokenizer: ", spec.special_tokens.size(), " special tokens do not fit the ", kReserved,
             " reserved ids");
  const int64_t num_base = vocab_size - kReserved;
  const std::vector<std::string> tokens = byte_level_vocabulary(num_base, spec.special_tokens);
  std::string model;
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    const auto bytes = tokenizer_detail::byte_level_table().decode(tokens[rank]);
    XMOE_CHECK(bytes.has_value(), "tokenizer: internal error: token ", rank, " is not byte-level");
    model += base64(*bytes) + " " + std::to_string(rank) + "\n";
  }
  write_text_file(dir + "/tiktoken.model", model);

  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  std::map<std::string, int32_t> ids;
  for (size_t i = 0; i < spec.special_tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(num_base + static_cast<int64_t>(i));
    decoder[std::to_string(id)] = added_token_entry(spec.special_tokens[i]);
    ids[spec.special_tokens[i].content] = id;
  }
  write_text_file(dir + "/tokenizer_config.json",
                  tokenizer_config_json(spec, std::move(decoder)).dump(2) + "\n");
  return ids;
}

}  // namespace xmoe::app
