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

// What a prefaulted checkpoint does about page-cache pages smaller than 2 MiB (io/page_cache.hpp): a file
// cached in 4 KiB pages (just written or downloaded) is mapped 4 KiB at a time and streams up to 1.5x slower.
enum class PageCacheMode { automatic, keep, reload };

// "auto" | "keep" | "reload"; throws xmoe::Error naming the value otherwise.
PageCacheMode parse_page_cache_mode(std::string_view text);

struct ReloadDecision {
  bool reload = false;
  std::string reason;  // why not, when not
};
// After a prefault that left `huge_mapped` of the `mappable` bytes mapped with 2 MiB entries: automatic
// re-reads when fewer than half are, the files have any 2 MiB block and the kernel's transparent huge pages
// are not off; reload always re-reads (where it can help at all); keep never.
ReloadDecision decide_reload(PageCacheMode mode, size_t huge_mapped, size_t mappable, bool thp_enabled);

// What a load did about prefaulting, for the load report.
struct PrefaultReport {
  PrefaultDecision decision;
  size_t bytes = 0;  // populated
  double seconds = 0;
  int error = 0;     // errno when the kernel refused (the weights are then faulted in as they are read)
  std::string file;  // the file it failed on
  // Mapped with 2 MiB entries after the prefault (and the re-read, if any), of the most that could be.
  size_t huge_mapped = 0, huge_mappable = 0;
  // The re-read into 2 MiB pages, when one ran: mapped so before it, its time, the errno and file of a
  // failure.
  bool reloaded = false;
  size_t huge_before = 0;
  double reload_seconds = 0;
  int reload_error = 0;
  std::string reload_file;
  std::string summary() const;  // one line, no newline
  // Whether to print the summary right after the load: when the kernel refused, when `requested`
  // (automatic) decided against it, or when the files were read again; otherwise the progress bar said it.
  bool worth_saying(PrefaultMode requested) const {
    return error != 0 || reloaded || (!decision.prefault && requested == PrefaultMode::automatic);
  }
};

}  // namespace xmoe::llm
