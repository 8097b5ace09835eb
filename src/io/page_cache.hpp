// Whether a memory-mapped file is read through 2 MiB page-table entries, and re-reading it so.
//
// The kernel maps a file's page-cache pages 2 MiB at a time (FilePmdMapped in /proc/self/smaps) only where
// they are cached as 2 MiB folios. Reading a file into a mapping advised MADV_HUGEPAGE caches it that way;
// writing it does not (a checkpoint that was just downloaded, converted or written by `xmoe init-model` sits
// in 4 KiB pages). On a 2-vCPU Sapphire Rapids VM a 622 MB lm_head streamed at 20.8 GB/s from such a file and
// at 30.2 GB/s after dropping it from the cache and reading it again through an advised mapping (2 threads).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "util/huge_buffer.hpp"  // kHugePageSize

namespace xmoe::io {

// The FilePmdMapped bytes of the mappings of /proc/self/smaps' text that overlap [begin, end).
size_t parse_file_pmd_mapped(std::string_view smaps, uintptr_t begin, uintptr_t end);
// This process's /proc/self/smaps (empty where it cannot be read). One read walks every mapping's page
// tables, so callers read it once for all their files.
std::string self_smaps();
// The FilePmdMapped bytes of `mapping` in that text.
size_t file_pmd_mapped(std::string_view smaps, std::span<const std::byte> mapping);
// The bytes of `mapping` in whole 2 MiB-aligned blocks: the most that 2 MiB entries can map.
size_t huge_mappable_bytes(std::span<const std::byte> mapping);

// Whether /sys/kernel/mm/transparent_hugepage/enabled's text ("always [madvise] never") allows huge pages
// to advised mappings; the running system's (false where the file is missing).
bool parse_transparent_huge_pages_enabled(std::string_view sysfs_text);
bool transparent_huge_pages_enabled();

// Lets the kernel back later reads of `mapping` with 2 MiB page-cache pages (MADV_HUGEPAGE). Returns 0 or
// the errno (EINVAL without transparent huge pages).
int advise_huge_pages(std::span<const std::byte> mapping);

// Removes this process's page-table entries for `mapping` (a read-only MAP_PRIVATE mapping of `path`, so
// nothing is lost: later reads fault the file in again), writes back the file's dirty pages and drops its
// page-cache pages that no other process maps, so the next read caches the file anew. Returns 0 or the errno
// of the step that failed.
int drop_cached_pages(const std::string& path, std::span<const std::byte> mapping);

}  // namespace xmoe::io
