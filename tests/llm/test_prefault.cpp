// The prefault policy of `xmoe generate` / `xmoe serve` (src/llm/prefault.hpp): when the mapped weights are
// populated at load, and what the load report says when they are not.
#include "llm/prefault.hpp"

#include <gtest/gtest.h>

#include <string>

#include "xmoe/error.hpp"

namespace {

using xmoe::llm::decide_prefault;
using xmoe::llm::parse_mem_available;
using xmoe::llm::parse_prefault_mode;
using xmoe::llm::PrefaultMode;
using xmoe::llm::PrefaultReport;

constexpr size_t kGB = 1000 * 1000 * 1000;

TEST(Prefault, ModesParseAndAnUnknownOneIsNamed) {
  EXPECT_EQ(parse_prefault_mode("auto"), PrefaultMode::automatic);
  EXPECT_EQ(parse_prefault_mode("on"), PrefaultMode::always);
  EXPECT_EQ(parse_prefault_mode("off"), PrefaultMode::never);
  try {
    parse_prefault_mode("yes");
    ADD_FAILURE() << "'yes' parsed";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'yes'"), std::string::npos) << e.what();
  }
}

TEST(Prefault, MemAvailableFromMeminfoText) {
  // The layout of a real /proc/meminfo (Linux 6.x), cut short.
  const std::string meminfo =
      "MemTotal:       24683520 kB\nMemFree:         9290240 kB\nMemAvailable:   23805952 kB\n"
      "Buffers:          123456 kB\n";
  EXPECT_EQ(parse_mem_available(meminfo), size_t{23805952} * 1024);
  EXPECT_EQ(parse_mem_available("MemTotal: 1 kB\nMemFree: 1 kB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available("MemAvailable: lots\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available("MemAvailable: 12 MB\n"), std::nullopt);
  EXPECT_EQ(parse_mem_available(""), std::nullopt);
  // Whatever this machine has, its /proc/meminfo parses (the tests run on Linux).
  EXPECT_TRUE(xmoe::llm::mem_available().has_value());
}

TEST(Prefault, AutomaticPrefaultsWhatFitsInNinetyPercentOfAvailableMemory) {
  EXPECT_TRUE(decide_prefault(PrefaultMode::automatic, 11 * kGB, 22 * kGB).prefault);
  EXPECT_TRUE(decide_prefault(PrefaultMode::automatic, 9 * kGB, 10 * kGB).prefault);
  const auto big = decide_prefault(PrefaultMode::automatic, 9 * kGB + 1, 10 * kGB);
  EXPECT_FALSE(big.prefault);
  EXPECT_NE(big.reason.find("9.00 GB"), std::string::npos) << big.reason;
  EXPECT_NE(big.reason.find("10.00 GB"), std::string::npos) << big.reason;
  const auto unknown = decide_prefault(PrefaultMode::automatic, 1, std::nullopt);
  EXPECT_FALSE(unknown.prefault);
  EXPECT_NE(unknown.reason.find("MemAvailable"), std::string::npos) << unknown.reason;
  // Asked for, it happens whatever the size; refused, never.
  EXPECT_TRUE(decide_prefault(PrefaultMode::always, 100 * kGB, 10 * kGB).prefault);
  EXPECT_TRUE(decide_prefault(PrefaultMode::always, 1, std::nullopt).prefault);
  EXPECT_FALSE(decide_prefault(PrefaultMode::never, 1, 10 * kGB).prefault);
}

TEST(Prefault, ReportSaysWhatHappened) {
  PrefaultReport done;
  done.decision.prefault = true;
  done.bytes = 11'210'000'000;
  done.seconds = 0.914;
  EXPECT_EQ(done.summary(), "weights prefaulted: 11.21 GB in 0.91 s");
  PrefaultReport failed = done;
  failed.bytes = 0;
  failed.error = 22;  // EINVAL: a kernel before 5.14
  failed.file = "/m/model.safetensors";
  EXPECT_NE(failed.summary().find("/m/model.safetensors"), std::string::npos) << failed.summary();
  EXPECT_NE(failed.summary().find("Invalid argument"), std::string::npos) << failed.summary();
  PrefaultReport skipped;
  skipped.decision = decide_prefault(PrefaultMode::never, 1, 10 * kGB);
  EXPECT_EQ(skipped.summary(), "weights not prefaulted: --prefault off");
}

TEST(Prefault, PageCacheModesParseAndAnUnknownOneIsNamed) {
  using xmoe::llm::PageCacheMode;
  using xmoe::llm::parse_page_cache_mode;
  EXPECT_EQ(parse_page_cache_mode("auto"), PageCacheMode::automatic);
  EXPECT_EQ(parse_page_cache_mode("keep"), PageCacheMode::keep);
  EXPECT_EQ(parse_page_cache_mode("reload"), PageCacheMode::reload);
  try {
    parse_page_cache_mode("huge");
    ADD_FAILURE() << "'huge' parsed";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'huge'"), std::string::npos) << e.what();
  }
}

TEST(Prefault, AutomaticReloadsWhenLessThanHalfIsMappedIn2MiBPages) {
  using xmoe::llm::decide_reload;
  using xmoe::llm::PageCacheMode;
  constexpr size_t mappable = 11 * kGB;
  EXPECT_TRUE(decide_reload(PageCacheMode::automatic, 0, mappable, true).reload);
  EXPECT_TRUE(decide_reload(PageCacheMode::automatic, mappable / 2 - 1, mappable, true).reload);
  const auto enough = decide_reload(PageCacheMode::automatic, mappable / 2, mappable, true);
  EXPECT_FALSE(enough.reload);
  EXPECT_NE(enough.reason.find("half"), std::string::npos) << enough.reason;
  // Where it cannot help: transparent huge pages off, or files too small for one 2 MiB block.
  const auto off = decide_reload(PageCacheMode::automatic, 0, mappable, false);
  EXPECT_FALSE(off.reload);
  EXPECT_NE(off.reason.find("transparent huge pages"), std::string::npos) << off.reason;
  EXPECT_FALSE(decide_reload(PageCacheMode::automatic, 0, 0, true).reload);
  EXPECT_FALSE(decide_reload(PageCacheMode::reload, 0, 0, true).reload);
  // Asked for, whatever is mapped already; refused, never.
  EXPECT_TRUE(decide_reload(PageCacheMode::reload, mappable, mappable, true).reload);
  EXPECT_FALSE(decide_reload(PageCacheMode::keep, 0, mappable, true).reload);
}

TEST(Prefault, ReportSaysWhatTheReReadDid) {
  PrefaultReport done;
  done.decision.prefault = true;
  done.bytes = 11'210'000'000;
  done.seconds = 0.914;
  done.huge_mapped = 11'200'000'000;
  done.huge_mappable = 11'210'000'000;
  EXPECT_EQ(done.summary(), "weights prefaulted: 11.21 GB in 0.91 s, 11.20 GB of 11.21 GB in 2 MiB pages");
  EXPECT_FALSE(done.worth_saying(xmoe::llm::PrefaultMode::automatic));
  PrefaultReport reread = done;
  reread.reloaded = true;
  reread.huge_before = 0;
  reread.reload_seconds = 6.4;
  EXPECT_EQ(reread.summary(),
            "weights prefaulted: 11.21 GB in 0.91 s, 0.00 GB of them in 2 MiB pages; read again in 6.40 s, "
            "11.20 GB of 11.21 GB in 2 MiB pages");
  EXPECT_TRUE(reread.worth_saying(xmoe::llm::PrefaultMode::automatic));
  PrefaultReport futile = reread;
  futile.huge_mapped = 0;
  EXPECT_NE(futile.summary().find("does not cache files in 2 MiB pages"), std::string::npos)
      << futile.summary();
  PrefaultReport refused = reread;
  refused.reload_error = 30;  // EROFS
  refused.reload_file = "/m/model-00002-of-00003.safetensors";
  EXPECT_NE(refused.summary().find("/m/model-00002-of-00003.safetensors"), std::string::npos)
      << refused.summary();
  EXPECT_NE(refused.summary().find("Read-only file system"), std::string::npos) << refused.summary();
}

}  // namespace
