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

}  // namespace
