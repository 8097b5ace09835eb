// Everything a checkpoint directory holds for running it: the checkpoint (config + weights), the tokenizer,
// the chat setup (template, eos ids, generation_config.json defaults) and, once loaded, the model. One loader
// shared by `xmoe generate`, `xmoe serve` and bindings, so they read a directory the same way.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "llm/chat_setup.hpp"
#include "llm/checkpoint.hpp"
#include "llm/model.hpp"
#include "llm/prefault.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::llm {

struct ModelBundle {
  std::string dir;
  Checkpoint checkpoint;
  std::optional<Tokenizer> tokenizer;  // dir/tokenizer.json, else dir/tiktoken.model, when present
  ChatSetup chat;
  std::unique_ptr<CausalLM> model;  // set by load_weights
  PrefaultReport prefault;          // set by load_weights

  // Opens the directory's files (cheap: the weights are mapped, not read). Throws xmoe::Error naming the
  // missing or malformed file.
  static ModelBundle open(const std::string& dir);
  // Prefaults the mapped weights as `prefault_mode` decides (prefault.hpp; a failure is reported in
  // `prefault`, not thrown), reads them again into 2 MiB page-cache pages where `page_cache_mode` decides,
  // then loads them, each with a progress bar on stderr ("prefaulting DIR", "reading DIR again into 2 MiB
  // pages", "loading DIR").
  void load_weights(DType dtype, const std::string& isa,
                    kernels::MatmulPrecision precision = kernels::MatmulPrecision::highest,
                    PrefaultMode prefault_mode = PrefaultMode::automatic,
                    PageCacheMode page_cache_mode = PageCacheMode::automatic);
  // The tokenizer, or an error saying what needs it.
  const Tokenizer& require_tokenizer(const std::string& purpose) const;

 private:
  // After a prefault: measures the 2 MiB mappings into `prefault`, and drops and prefaults the files again
  // where `mode` decides (prefault.hpp).
  void reload_into_huge_pages(PageCacheMode mode);
};

}  // namespace xmoe::llm
