#include "llm/model_bundle.hpp"

#include <filesystem>

#include "llm/progress_bar.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

ModelBundle ModelBundle::open(const std::string& dir) {
  XMOE_CHECK(std::filesystem::is_directory(dir), "model ", dir, " is not a directory");
  ModelBundle b{dir, Checkpoint::open(dir), std::nullopt, {}, nullptr};
  const std::string tokenizer_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (std::filesystem::exists(tokenizer_path)) b.tokenizer = Tokenizer::from_file(tokenizer_path);
  b.chat = load_chat_setup(dir, b.checkpoint.config(), b.tokenizer ? &*b.tokenizer : nullptr);
  return b;
}

void ModelBundle::load_weights(DType dtype, const std::string& isa) {
  LoadOptions load;
  load.dtype = dtype;
  load.isa = isa;
  ProgressBar bar("loading " + dir);
  load.progress = bar.callback();
  model = load_model(checkpoint, load);
  bar.finish();
}

const Tokenizer& ModelBundle::require_tokenizer(const std::string& purpose) const {
  XMOE_CHECK(tokenizer.has_value(), (std::filesystem::path(dir) / "tokenizer.json").string(),
             " is missing: ", purpose, " needs it");
  return *tokenizer;
}

}  // namespace xmoe::llm
