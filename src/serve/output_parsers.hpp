// The output parser of each model family (one file each); make_output_parser picks one by OutputFormat.
#pragma once
#include <memory>

#include "serve/output_parser.hpp"

namespace xmoe::serve {

std::unique_ptr<OutputParser> make_plain_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_qwen3_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_qwen3_coder_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_harmony_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_deepseek_v3_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_deepseek_v32_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_kimi_k2_output_parser(const OutputParserOptions& options);
std::unique_ptr<OutputParser> make_glm4_output_parser(const OutputParserOptions& options);

}  // namespace xmoe::serve
