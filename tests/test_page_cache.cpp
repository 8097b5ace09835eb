// Page-cache page sizes of mapped checkpoint files (src/io/page_cache.hpp): reading FilePmdMapped from
// /proc/self/smaps, the 2 MiB blocks a mapping can hold, the transparent-huge-page switch, and dropping a
// mapped file's cached pages without losing a byte of what the mapping reads; and anonymous buffers in 2 MiB
// pages (src/util/huge_buffer.hpp).
#include "io/page_cache.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "util/huge_buffer.hpp"
#include "xmoe/safetensors.hpp"

namespace fs = std::filesystem;
using xmoe::kHugePageSize;

namespace {

std::span<const std::byte> fake_span(uintptr_t address, size_t bytes) {
  return {reinterpret_cast<const std::byte*>(address), bytes};
}

// Cut from a real /proc/self/smaps (Linux 6.18): a file mapping whose last page reaches past the file's end
// of data, a neighbour, and an anonymous mapping without a path.
constexpr const char* kSmaps =
    "7f2072e00000-7f2073000000 r--p 00000000 fe:00 10952796                   "
    "/m/model-00003-of-00003.safetensors\n"
    "Size:               2048 kB\n"
    "Rss:                2048 kB\n"
    "AnonHugePages:         0 kB\n"
    "FilePmdMapped:      2048 kB\n"
    "THPeligible:           0\n"
    "VmFlags: rd mr mw me hg \n"
    "7f2073000000-7f2073a17000 r--p 00200000 fe:00 10952796                   "
    "/m/model-00003-of-00003.safetensors\n"
    "Size:              10332 kB\n"
    "FilePmdMapped:      8192 kB\n"
    "VmFlags: rd mr mw me \n"
    "7f2073a1e000-7f2073a44000 r--p 00000000 fe:00 332835                     "
    "/usr/lib/x86_64-linux-gnu/libc.so.6\n"
    "FilePmdMapped:         0 kB\n"
    "7ffd1c000000-7ffd1c400000 rw-p 00000000 00:00 0 \n"
    "AnonHugePages:      4096 kB\n"
    "FilePmdMapped:      4096 kB\n";

TEST(PageCache, FilePmdMappedSumsTheMappingsThatOverlapTheRange) {
  using xmoe::io::parse_file_pmd_mapped;
  // Both halves of the split file mapping, even though the range ends inside the second's last page.
  EXPECT_EQ(parse_file_pmd_mapped(kSmaps, 0x7f2072e00000, 0x7f2073a16100), size_t{10240} << 10);
  EXPECT_EQ(parse_file_pmd_mapped(kSmaps, 0x7f2072e00000, 0x7f2073000000), size_t{2048} << 10);
  EXPECT_EQ(parse_file_pmd_mapped(kSmaps, 0x7f2073100000, 0x7f2073200000), size_t{8192} << 10);
  EXPECT_EQ(parse_file_pmd_mapped(kSmaps, 0x7ffd1c000000, 0x7ffd1c400000), size_t{4096} << 10);
  EXPECT_EQ(parse_file_pmd_mapped(kSmaps, 0x1000, 0x2000), 0u);
  EXPECT_EQ(parse_file_pmd_mapped("", 0, ~uintptr_t{0}), 0u);
  EXPECT_EQ(parse_file_pmd_mapped("7f00-7f10 r--p\nFilePmdMapped: lots kB\n", 0, ~uintptr_t{0}), 0u);
}

TEST(PageCache, MappableBytesAreTheWhole2MiBBlocks) {
  using xmoe::io::huge_mappable_bytes;
  constexpr uintptr_t base = uintptr_t{0x7f0000000000};
  EXPECT_EQ(huge_mappable_bytes(fake_span(base, 5 * kHugePageSize + 7)), 5 * kHugePageSize);
  EXPECT_EQ(huge_mappable_bytes(fake_span(base + 4096, 5 * kHugePageSize)), 4 * kHugePageSize);
  EXPECT_EQ(huge_mappable_bytes(fake_span(base, kHugePageSize - 1)), 0u);
  EXPECT_EQ(huge_mappable_bytes(fake_span(base + 4096, kHugePageSize)), 0u);
}

TEST(PageCache, TransparentHugePagesSwitch) {
  using xmoe::io::parse_transparent_huge_pages_enabled;
  EXPECT_TRUE(parse_transparent_huge_pages_enabled("always [madvise] never\n"));
  EXPECT_TRUE(parse_transparent_huge_pages_enabled("[always] madvise never\n"));
  EXPECT_FALSE(parse_transparent_huge_pages_enabled("always madvise [never]\n"));
  EXPECT_FALSE(parse_transparent_huge_pages_enabled(""));
}

class PageCacheFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / ("xmoe_pc_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// The VmFlags line of the /proc/self/smaps mapping that holds `address` ("" when none does).
std::string vm_flags(const std::string& smaps, const void* address) {
  const auto at = reinterpret_cast<unsigned long>(address);
  bool inside = false;
  size_t pos = 0;
  while (pos < smaps.size()) {
    const size_t eol = std::min(smaps.find('\n', pos), smaps.size());
    const std::string line = smaps.substr(pos, eol - pos);
    pos = eol + 1;
    unsigned long lo = 0, hi = 0;
    char space = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx%c", &lo, &hi, &space) == 3 && space == ' ') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return {};
}

TEST(HugeBuffer, WholeAligned2MiBPagesAdvised) {
  const size_t bytes = (size_t{3} << 20) + 1;
  const xmoe::HugeBuffer buffer = xmoe::allocate_huge_buffer(bytes);
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.get()) % kHugePageSize, 0u);
  std::memset(buffer.get(), 0x5a, 2 * kHugePageSize);  // the rounded size is the caller's to use
  EXPECT_EQ(buffer[2 * kHugePageSize - 1], std::byte{0x5a});
  const std::string smaps = xmoe::io::self_smaps();
  if (smaps.empty()) GTEST_SKIP() << "/proc/self/smaps is not readable here";
  if (xmoe::io::transparent_huge_pages_enabled()) {
    EXPECT_NE(vm_flags(smaps, buffer.get()).find(" hg"), std::string::npos) << vm_flags(smaps, buffer.get());
  }
}

TEST_F(PageCacheFile, DroppedPagesReadBackTheSameBytes) {
  // 6 MiB of a pattern no two pages share, so a page read back from the wrong place would show.
  std::vector<std::byte> codes(size_t{6} << 20);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  const std::string path = (dir_ / "codes.safetensors").string();
  xmoe::save_safetensors_raw(path, {{"codes", "U8", {static_cast<int64_t>(codes.size())}, {codes}}});
  const xmoe::SafetensorsFile f = xmoe::SafetensorsFile::open(path);
  const std::span<const std::byte> data = f.bytes("codes");
  ASSERT_EQ(f.prefault(0, data.size()), 0);
  const std::string smaps = xmoe::io::self_smaps();
  if (smaps.empty()) GTEST_SKIP() << "/proc/self/smaps is not readable here";
  // Opening advised the mapping for 2 MiB pages wherever the kernel has them.
  if (xmoe::io::transparent_huge_pages_enabled()) {
    EXPECT_NE(vm_flags(smaps, f.mapping().data()).find(" hg"), std::string::npos)
        << vm_flags(smaps, f.mapping().data());
  }
  EXPECT_LE(xmoe::io::file_pmd_mapped(smaps, f.mapping()), xmoe::io::huge_mappable_bytes(f.mapping()));
  EXPECT_GE(xmoe::io::huge_mappable_bytes(f.mapping()), 2 * kHugePageSize);

  ASSERT_EQ(xmoe::io::drop_cached_pages(path, f.mapping()), 0) << std::strerror(errno);
  EXPECT_EQ(std::memcmp(data.data(), codes.data(), codes.size()), 0);
  ASSERT_EQ(f.prefault(0, data.size()), 0);
  EXPECT_EQ(std::memcmp(data.data(), codes.data(), codes.size()), 0);
  EXPECT_LE(xmoe::io::file_pmd_mapped(xmoe::io::self_smaps(), f.mapping()),
            xmoe::io::huge_mappable_bytes(f.mapping()));
  // A file gone since it was mapped: its errno, and the mapping still reads what it mapped.
  const std::string moved = (dir_ / "moved.safetensors").string();
  fs::rename(path, moved);
  EXPECT_EQ(xmoe::io::drop_cached_pages(path, f.mapping()), ENOENT);
  EXPECT_EQ(std::memcmp(data.data(), codes.data(), codes.size()), 0);
}

}  // namespace
