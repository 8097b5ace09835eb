// Whole-file reads and writes of the small text files around a checkpoint (config.json, tokenizer.json,
// templates), with errors that name the file.
#pragma once
#include <string>

namespace xmoe {

std::string read_text_file(const std::string& path);                     // throws "<path>: cannot open: ..."
void write_text_file(const std::string& path, const std::string& text);  // truncates; throws naming path

}  // namespace xmoe
