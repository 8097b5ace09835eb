// tokenizer.json "post_processor" for a single sequence (encode(..., add_special_tokens=true)):
// TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (ids unchanged) and Sequence of them.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "llm/tokenizer/json_fields.hpp"

namespace xmoe::tokenizer_detail {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual std::vector<int32_t> process(std::vector<int32_t> ids) const = 0;
};

// nullptr for a null post-processor.
std::unique_ptr<PostProcessor> parse_post_processor(const Json& json, const JsonPath& at);

}  // namespace xmoe::tokenizer_detail
