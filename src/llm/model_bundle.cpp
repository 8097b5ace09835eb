#include "llm/model_bundle.hpp"

#include <chrono>
#include <filesystem>

#include "llm/progress_bar.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

// tokenizer.json when present, else a tiktoken vocabulary (tiktoken.model, e.g. Kimi-K2) with the special
// tokens of tokenizer_config.json beside it.
std::optional<Tokenizer> open_tokenizer(const std::string& dir) {
  const std::filesystem::path root(dir);
  if (std::filesystem::exists(root / "tokenizer.json"))
    return Tokenizer::from_file((root / "tokenizer.json").string());
  if (!std::filesystem::exists(root / "tiktoken.model")) return std::nullopt;
  const std::filesystem::path config = root / "tokenizer_config.json";
  return Tokenizer::from_tiktoken_file((root / "tiktoken.model").string(),
                                       std::filesystem::exists(config) ? config.string() : std::string());
}

}  // namespace

ModelBundle ModelBundle::open(const std::string& dir) {
  XMOE_CHECK(std::filesystem::is_directory(dir), "model ", dir, " is not a directory");
  ModelBundle b{dir, Checkpoint::open(dir), std::nullopt, {}, nullptr, {}};
  b.tokenizer = open_tokenizer(dir);
  b.chat = load_chat_setup(dir, b.checkpoint.config(), b.tokenizer ? &*b.tokenizer : nullptr);
  return b;
}

void ModelBundle::load_weights(DType dtype, const std::string& isa, kernels::MatmulPrecision precision,
                               PrefaultMode prefault_mode) {
  // Before the load, so that the loader's own reads (validation, conversions) find the pages mapped too.
  prefault = PrefaultReport{};
  prefault.decision = decide_prefault(prefault_mode, checkpoint.total_bytes(), mem_available());
  if (prefault.decision.prefault) {
    const auto start = std::chrono::steady_clock::now();
    ProgressBar bar("prefaulting " + dir);
    const Checkpoint::PrefaultResult done = checkpoint.prefault(bar.callback());
    bar.finish();
    prefault.bytes = done.bytes;
    prefault.error = done.error;
    prefault.file = done.file;
    prefault.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  LoadOptions load;
  load.dtype = dtype;
  load.isa = isa;
  load.matmul_precision = precision;
  ProgressBar bar("loading " + dir);
  load.progress = bar.callback();
  model = load_model(checkpoint, load);
  bar.finish();
}

const Tokenizer& ModelBundle::require_tokenizer(const std::string& purpose) const {
  XMOE_CHECK(tokenizer.has_value(), (std::filesystem::path(dir) / "tokenizer.json").string(),
             " (or tiktoken.model) is missing: ", purpose, " needs it");
  return *tokenizer;
}

}  // namespace xmoe::llm
