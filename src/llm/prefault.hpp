// Whether a checkpoint's mapped weights enter the page tables at load (prefault) or at their first read.
// Decode reads a different few experts per token, so without a prefault the first tokens of a run (or of a
// server's life) also pay a page fault per 64 KiB of every expert they meet first, and time varies with which
// experts those are. llama.cpp prefaults its mapping for the same reason (MAP_POPULATE).
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace xmoe::llm {

enum class PrefaultMode { automatic, always, never };

// "auto" | "on" | "off"; throws xmoe::Error naming the value otherwise.
PrefaultMode parse_prefault_mode(std::string_view text);

// MemAvailable of /proc/meminfo's text in bytes (free memory plus what the kernel can reclaim, page cache
// included); nullopt when the line is missing or malformed.
std::optional<size_t> parse_mem_available(std::string_view meminfo);
// The running system's, read from /proc/meminfo; nullopt where there is none.
std::optional<size_t> mem_available();

struct PrefaultDecision {
  bool prefault = false;
  std::string reason;  // why not, when not
};
// automatic prefaults when the checkpoint fits in 90 % of the available memory: a larger one read in whole
// would evict its own pages (and everyone else's page cache) while loading; it is read as decode needs it.
PrefaultDecision decide_prefault(PrefaultMode mode, size_t checkpoint_bytes, std::optional<size_t> available);

// What a load did about prefaulting, for the load report.
struct PrefaultReport {
  PrefaultDecision decision;
  size_t bytes = 0;  // populated
  double seconds = 0;
  int error = 0;     // errno when the kernel refused (the weights are then faulted in as they are read)
  std::string file;  // the file it failed on
  std::string summary() const;  // one line, no newline
  // Whether to print the summary right after the load: when the kernel refused, or when `requested`
  // (automatic) decided against it; otherwise the progress bar has said it.
  bool worth_saying(PrefaultMode requested) const {
    return error != 0 || (!decision.prefault && requested == PrefaultMode::automatic);
  }
};

}  // namespace xmoe::llm
