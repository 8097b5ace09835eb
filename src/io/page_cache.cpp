#include "io/page_cache.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace xmoe::io {
namespace {

std::string read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "7f2072e00000-7f20d3e00000 r--p ..." → the range; false for the "Key: value" lines.
bool parse_range(std::string_view line, uintptr_t& lo, uintptr_t& hi) {
  const size_t dash = line.find('-'), space = line.find(' ');
  if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) return false;
  const std::string first(line.substr(0, dash)), second(line.substr(dash + 1, space - dash - 1));
  if (first.empty() || second.empty()) return false;
  char* end = nullptr;
  lo = std::strtoull(first.c_str(), &end, 16);
  if (*end != '\0') return false;
  hi = std::strtoull(second.c_str(), &end, 16);
  return *end == '\0';
}

}  // namespace

size_t parse_file_pmd_mapped(std::string_view smaps, uintptr_t begin, uintptr_t end) {
  constexpr std::string_view key = "FilePmdMapped:";
  size_t total = 0;
  bool inside = false;
  size_t at = 0;
  while (at < smaps.size()) {
    const size_t eol = std::min(smaps.find('\n', at), smaps.size());
    const std::string_view line = smaps.substr(at, eol - at);
    at = eol + 1;
    uintptr_t lo = 0, hi = 0;
    if (parse_range(line, lo, hi)) {
      // Overlap, not containment: a mapping's last page reaches past a file whose size is not a whole page.
      inside = lo < end && hi > begin;
      continue;
    }
    if (!inside || line.substr(0, key.size()) != key) continue;
    std::istringstream fields{std::string(line.substr(key.size()))};
    size_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") total += kib << 10;
  }
  return total;
}

std::string self_smaps() {
  return read_text("/proc/self/smaps");
}

size_t file_pmd_mapped(std::string_view smaps, std::span<const std::byte> mapping) {
  const auto begin = reinterpret_cast<uintptr_t>(mapping.data());
  return parse_file_pmd_mapped(smaps, begin, begin + mapping.size());
}

size_t huge_mappable_bytes(std::span<const std::byte> mapping) {
  const auto begin = reinterpret_cast<uintptr_t>(mapping.data()), end = begin + mapping.size();
  const uintptr_t first = (begin + kHugePageSize - 1) / kHugePageSize, last = end / kHugePageSize;
  return last > first ? (last - first) * kHugePageSize : 0;
}

bool parse_transparent_huge_pages_enabled(std::string_view sysfs_text) {
  return sysfs_text.find("[always]") != std::string_view::npos ||
         sysfs_text.find("[madvise]") != std::string_view::npos;
}

bool transparent_huge_pages_enabled() {
  return parse_transparent_huge_pages_enabled(read_text("/sys/kernel/mm/transparent_hugepage/enabled"));
}

int advise_huge_pages(std::span<const std::byte> mapping) {
#ifdef MADV_HUGEPAGE
  void* start = const_cast<std::byte*>(mapping.data());
  return ::madvise(start, mapping.size(), MADV_HUGEPAGE) == 0 ? 0 : errno;
#else
  (void)mapping;
  return ENOSYS;
#endif
}

int drop_cached_pages(const std::string& path, std::span<const std::byte> mapping) {
  // Pages this process maps are not dropped, so its own entries go first.
  void* start = const_cast<std::byte*>(mapping.data());
  if (::madvise(start, mapping.size(), MADV_DONTNEED) != 0) return errno;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  // Dirty pages (a file written moments ago) cannot be dropped until they are on disk.
  int error = ::fdatasync(fd) == 0 ? 0 : errno;
  if (error == 0) error = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return error;
}

}  // namespace xmoe::io
