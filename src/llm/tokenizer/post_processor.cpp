#include "llm/tokenizer/post_processor.hpp"

#include <map>
#include <string>

namespace xmoe::tokenizer_detail {
namespace {

class IdentityPostProcessor final : public PostProcessor {  // ByteLevel: it only adjusts offsets
 public:
  std::vector<int32_t> process(std::vector<int32_t> ids) const override { return ids; }
};

// The single-sequence template as a list of pieces: special-token ids, or -1 for the sequence itself.
class TemplatePostProcessor final : public PostProcessor {
 public:
  explicit TemplatePostProcessor(std::vector<std::vector<int32_t>> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    std::vector<int32_t> out;
    for (const auto& piece : pieces_) {
      if (piece.empty()) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), piece.begin(), piece.end());
      }
    }
    return out;
  }

 private:
  std::vector<std::vector<int32_t>> pieces_;  // empty = the sequence
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  std::vector<int32_t> process(std::vector<int32_t> ids) const override {
    for (const auto& step : steps_) ids = step->process(std::move(ids));
    return ids;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> parse_template(const Json& json, const JsonPath& at) {
  std::map<std::string, std::vector<int32_t>> specials;
  if (const Json* table = optional_field(json, "special_tokens")) {
    XMOE_CHECK(table->is_object(), (at / "special_tokens").str(), ": expected an object");
    for (auto it = table->begin(); it != table->end(); ++it) {
      const JsonPath where = at / "special_tokens" / it.key();
      const Json& ids = require_array(it.value(), "ids", where);
      std::vector<int32_t> list;
      for (size_t i = 0; i < ids.size(); ++i) list.push_back(to_id(ids[i], (where / "ids")[i]));
      specials[it.key()] = std::move(list);
    }
  }
  const Json& single = require_array(json, "single", at);
  std::vector<std::vector<int32_t>> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonPath where = (at / "single")[i];
    if (const Json* special = optional_field(single[i], "SpecialToken")) {
      const std::string name = require_string(*special, "id", where / "SpecialToken");
      auto it = specials.find(name);
      XMOE_CHECK(it != specials.end(), (where / "SpecialToken" / "id").str(), ": '", name,
                 "' is not in special_tokens");
      XMOE_CHECK(!it->second.empty(), (at / "special_tokens" / name / "ids").str(), ": empty");
      pieces.push_back(it->second);
    } else if (optional_field(single[i], "Sequence")) {
      pieces.emplace_back();  // in a single-sequence template this is $A
    } else {
      XMOE_CHECK(false, where.str(), ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  return std::make_unique<TemplatePostProcessor>(std::move(pieces));
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id]; single = cls $A sep.
std::unique_ptr<PostProcessor> parse_cls_sep(const Json& json, const JsonPath& at) {
  auto id_of = [&](std::string_view key) {
    const Json& pair = require(json, key, at);
    XMOE_CHECK(pair.is_array() && pair.size() == 2, (at / key).str(), ": expected [token, id]");
    return to_id(pair[1], (at / key)[1]);
  };
  return std::make_unique<TemplatePostProcessor>(
      std::vector<std::vector<int32_t>>{{id_of("cls")}, {}, {id_of("sep")}});
}

}  // namespace

std::unique_ptr<PostProcessor> parse_post_processor(const Json& json, const JsonPath& at) {
  if (json.is_null()) return nullptr;
  const std::string type = require_string(json, "type", at);
  if (type == "ByteLevel") return std::make_unique<IdentityPostProcessor>();
  if (type == "TemplateProcessing") return parse_template(json, at);
  if (type == "RobertaProcessing" || type == "BertProcessing") return parse_cls_sep(json, at);
  if (type == "Sequence") {
    const Json& list = require_array(json, "processors", at);
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = parse_post_processor(list[i], (at / "processors")[i]);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePostProcessor>(std::move(steps));
  }
  XMOE_CHECK(false, (at / "type").str(), ": unsupported post-processor type '", type,
             "' (supported: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence)");
  __builtin_unreachable();
}

}  // namespace xmoe::tokenizer_detail
