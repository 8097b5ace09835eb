#include "llm/prefault.hpp"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "xmoe/error.hpp"

namespace xmoe::llm {

PrefaultMode parse_prefault_mode(std::string_view text) {
  if (text == "auto") return PrefaultMode::automatic;
  if (text == "on") return PrefaultMode::always;
  if (text == "off") return PrefaultMode::never;
  throw Error("prefault mode '" + std::string(text) + "' is not one of auto, on, off");
}

PageCacheMode parse_page_cache_mode(std::string_view text) {
  if (text == "auto") return PageCacheMode::automatic;
  if (text == "keep") return PageCacheMode::keep;
  if (text == "reload") return PageCacheMode::reload;
  throw Error("page-cache mode '" + std::string(text) + "' is not one of auto, keep, reload");
}

std::optional<size_t> parse_mem_available(std::string_view meminfo) {
  constexpr std::string_view key = "MemAvailable:";
  size_t at = 0;
  while (at < meminfo.size()) {
    const size_t eol = std::min(meminfo.find('\n', at), meminfo.size());
    const std::string_view line = meminfo.substr(at, eol - at);
    at = eol + 1;
    if (line.substr(0, key.size()) != key) continue;
    std::istringstream in{std::string(line.substr(key.size()))};
    unsigned long long kib = 0;
    std::string unit;
    if (!(in >> kib >> unit) || unit != "kB") return std::nullopt;
    return static_cast<size_t>(kib) * 1024;
  }
  return std::nullopt;
}

std::optional<size_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_mem_available(text.str());
}

namespace {

std::string gigabytes(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB", static_cast<double>(bytes) / 1e9);
  return text;
}

}  // namespace

PrefaultDecision decide_prefault(PrefaultMode mode, size_t checkpoint_bytes,
                                 std::optional<size_t> available) {
  switch (mode) {
    case PrefaultMode::always:
      return {true, ""};
    case PrefaultMode::never:
      return {false, "--prefault off"};
    case PrefaultMode::automatic:
      if (!available) return {false, "the available memory is unknown (no MemAvailable in /proc/meminfo)"};
      if (static_cast<double>(checkpoint_bytes) > 0.9 * static_cast<double>(*available))
        return {false, "the checkpoint (" + gigabytes(checkpoint_bytes) +
                           ") exceeds 90 % of the available memory (" + gigabytes(*available) +
                           "); weights are read as decode first needs them"};
      return {true, ""};
  }
  return {false, "unknown mode"};
}

ReloadDecision decide_reload(PageCacheMode mode, size_t huge_mapped, size_t mappable, bool thp_enabled) {
  if (mode == PageCacheMode::keep) return {false, "--page-cache keep"};
  if (mappable == 0) return {false, "no file holds a whole 2 MiB block"};
  if (!thp_enabled) return {false, "transparent huge pages are off"};
  if (mode == PageCacheMode::reload) return {true, ""};
  if (2 * huge_mapped >= mappable) return {false, "at least half is mapped in 2 MiB pages"};
  return {true, ""};
}

std::string PrefaultReport::summary() const {
  if (!decision.prefault) return "weights not prefaulted: " + decision.reason;
  if (error != 0)
    return "weights prefaulted only in part (" + gigabytes(bytes) + "): madvise(MADV_POPULATE_READ) on " +
           file + " failed: " + std::strerror(error) + "; the rest is faulted in as decode reads it";
  char seconds_text[32];
  std::snprintf(seconds_text, sizeof seconds_text, "%.2f s", seconds);
  std::string text = "weights prefaulted: " + gigabytes(bytes) + " in " + seconds_text;
  if (reload_error != 0)
    return text + "; dropping " + reload_file +
           " from the page cache to read it into 2 MiB pages failed: " + std::strerror(reload_error);
  if (reloaded) {
    std::snprintf(seconds_text, sizeof seconds_text, "%.2f s", reload_seconds);
    text += ", " + gigabytes(huge_before) + " of them in 2 MiB pages; read again in " + seconds_text;
  }
  if (huge_mappable > 0)
    text += ", " + gigabytes(huge_mapped) + " of " + gigabytes(huge_mappable) + " in 2 MiB pages";
  if (reloaded && 2 * huge_mapped < huge_mappable)
    text +=
        " (most stayed in smaller pages: this kernel or file system does not cache files in 2 MiB pages, "
        "or another process maps them; --page-cache keep skips the re-read)";
  return text;
}

}  // namespace xmoe::llm
