#include "llm/model_bundle.hpp"

#include <chrono>
#include <filesystem>

#include "io/page_cache.hpp"
#include "llm/progress_bar.hpp"
#include "util/clock.hpp"
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
                               PrefaultMode prefault_mode, PageCacheMode page_cache_mode) {
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
    if (done.error == 0) reload_into_huge_pages(page_cache_mode);
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

void ModelBundle::reload_into_huge_pages(PageCacheMode mode) {
  const Checkpoint::HugePages pages = checkpoint.huge_pages();
  prefault.huge_mapped = pages.mapped;
  prefault.huge_mappable = pages.mappable;
  if (!decide_reload(mode, pages.mapped, pages.mappable, io::transparent_huge_pages_enabled()).reload) return;
  // Pages cached before the files were mapped (a checkpoint just written) keep their size; read anew through
  // the advised mapping, they come back 2 MiB at a time.
  const double start = wall_seconds();
  prefault.reloaded = true;
  prefault.huge_before = pages.mapped;
  const Checkpoint::PrefaultResult dropped = checkpoint.drop_cached_pages();
  prefault.reload_error = dropped.error;
  prefault.reload_file = dropped.file;
  // Also after a failed drop: the entries it removed are put back.
  ProgressBar bar("reading " + dir + " again into 2 MiB pages");
  const Checkpoint::PrefaultResult done = checkpoint.prefault(bar.callback());
  bar.finish();
  if (done.error != 0) {
    prefault.error = done.error;
    prefault.file = done.file;
  }
  prefault.reload_seconds = wall_seconds() - start;
  prefault.huge_mapped = checkpoint.huge_pages().mapped;
}

const Tokenizer& ModelBundle::require_tokenizer(const std::string& purpose) const {
  XMOE_CHECK(tokenizer.has_value(), (std::filesystem::path(dir) / "tokenizer.json").string(),
             " (or tiktoken.model) is missing: ", purpose, " needs it");
  return *tokenizer;
}

}  // namespace xmoe::llm
