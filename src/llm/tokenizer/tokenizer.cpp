// The tokenizer.json pipeline: added tokens, normalizer, pre-tokenizer, BPE, post-processor; and the
// ByteLevel decoder (batch and streaming).
#include "xmoe/tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "llm/tokenizer/added_vocabulary.hpp"
#include "llm/tokenizer/bpe_model.hpp"
#include "llm/tokenizer/byte_level.hpp"
#include "llm/tokenizer/json_fields.hpp"
#include "llm/tokenizer/normalizer.hpp"
#include "llm/tokenizer/post_processor.hpp"
#include "llm/tokenizer/pre_tokenizer.hpp"
#include "llm/tokenizer/tokenizer_impl.hpp"
#include "llm/tokenizer/utf8.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe {
namespace tokenizer_detail {

enum class DecoderKind {
  kJoinWithSpaces,  // no decoder: HF joins the tokens with " "
  kByteLevel,
};

// The tokenizer.json pipeline.
class JsonTokenizer final : public TokenizerImpl {
 public:
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<AddedVocabulary> added;
  std::unique_ptr<PostProcessor> post_processor;
  DecoderKind decoder = DecoderKind::kJoinWithSpaces;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    std::vector<std::string> words;
    for (TextPiece& piece : added->split(text, normalizer.get())) {
      if (piece.id) {
        ids.push_back(*piece.id);
        continue;
      }
      words.clear();
      words.push_back(std::move(piece.text));
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(words);
      for (const std::string& word : words) model->tokenize(word, ids);
    }
    if (add_special_tokens && post_processor) ids = post_processor->process(std::move(ids));
    return ids;
  }

  // ByteLevel: the token mapped back to bytes when every character is in the byte table, the token's own
  // bytes otherwise.
  std::optional<std::string> decoded_piece(int32_t id, bool skip_special_tokens) const override {
    const std::string* token = token_of(id);
    if (!token || (skip_special_tokens && added->is_special(id))) return std::nullopt;
    if (decoder == DecoderKind::kByteLevel) {
      if (auto bytes = byte_level_table().decode(*token)) return bytes;
    }
    return *token;
  }

  bool joins_pieces_with_spaces() const override { return decoder == DecoderKind::kJoinWithSpaces; }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    if (auto id = added->token_to_id(token)) return id;
    return model->token_to_id(token);
  }

  std::string id_to_token(int32_t id) const override {
    const std::string* token = token_of(id);
    return token ? *token : std::string();
  }

  int64_t vocab_size() const override { return std::max(model->max_id(), added->max_id()) + 1; }
  bool is_special(int32_t id) const override { return added->is_special(id); }

 private:
  const std::string* token_of(int32_t id) const {
    if (const AddedToken* token = added->by_id(id)) return &token->surface;
    return model->id_to_token(id);
  }
};

namespace {

DecoderKind parse_decoder(const Json& json, const JsonPath& at) {
  if (json.is_null()) return DecoderKind::kJoinWithSpaces;
  const std::string type = require_string(json, "type", at);
  if (type == "ByteLevel") return DecoderKind::kByteLevel;
  if (type == "Sequence") {
    // A Sequence of the one ByteLevel decoder decodes like that decoder.
    const Json& list = require_array(json, "decoders", at);
    XMOE_CHECK(list.size() == 1, (at / "decoders").str(),
               ": unsupported decoder sequence (supported: a single ByteLevel decoder)");
    const std::string inner = require_string(list[0], "type", (at / "decoders")[0]);
    XMOE_CHECK(inner == "ByteLevel", ((at / "decoders")[0] / "type").str(), ": unsupported decoder type '",
               inner, "' (supported: ByteLevel)");
    return DecoderKind::kByteLevel;
  }
  XMOE_CHECK(false, (at / "type").str(), ": unsupported decoder type '", type, "' (supported: ByteLevel)");
  __builtin_unreachable();
}

}  // namespace
}  // namespace tokenizer_detail

using tokenizer_detail::JsonPath;
using tokenizer_detail::JsonTokenizer;
using tokenizer_detail::TokenizerImpl;

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json_path) {
  return from_json(read_text_file(tokenizer_json_path), tokenizer_json_path);
}

Tokenizer Tokenizer::from_json(const std::string& json_text, const std::string& where) {
  using namespace tokenizer_detail;
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw Error(where + ": invalid JSON: " + e.what());
  }
  const JsonPath root{where, ""};
  XMOE_CHECK(json.is_object(), where, ": expected a JSON object at the top level");
  auto impl = std::make_shared<JsonTokenizer>();
  impl->model = std::make_unique<BpeModel>(require(json, "model", root), root / "model");
  const Json null_json;
  auto field = [&](const char* key) -> const Json& {
    const Json* value = optional_field(json, key);
    return value ? *value : null_json;
  };
  impl->normalizer = parse_normalizer(field("normalizer"), root / "normalizer");
  impl->pre_tokenizer = parse_pre_tokenizer(field("pre_tokenizer"), root / "pre_tokenizer");
  impl->post_processor = parse_post_processor(field("post_processor"), root / "post_processor");
  impl->decoder = parse_decoder(field("decoder"), root / "decoder");
  impl->added = std::make_unique<AddedVocabulary>(field("added_tokens"), root / "added_tokens",
                                                  impl->normalizer.get(), *impl->model);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(tokenizer_detail::to_valid_utf8(text), add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    auto piece = impl_->decoded_piece(id, skip_special_tokens);
    if (!piece) continue;
    if (impl_->joins_pieces_with_spaces() && !first) bytes += ' ';
    bytes += *piece;
    first = false;
  }
  return tokenizer_detail::to_valid_utf8(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  return impl_->id_to_token(id);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size();
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->is_special(id);
}

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& t, bool skip_special_tokens)
    : impl_(t.impl_), skip_special_tokens_(skip_special_tokens) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  auto piece = impl_->decoded_piece(id, skip_special_tokens_);
  if (!piece) return {};
  if (impl_->joins_pieces_with_spaces() && !first_) pending_ += ' ';
  first_ = false;
  pending_ += *piece;
  // Everything but a trailing sequence that may still complete is final: lossy UTF-8 decoding of a prefix
  // that ends on such a boundary does not depend on what follows.
  const size_t hold = tokenizer_detail::incomplete_tail_length(pending_);
  std::string ready =
      tokenizer_detail::to_valid_utf8(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string rest = tokenizer_detail::to_valid_utf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace xmoe
