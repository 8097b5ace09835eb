#include "kernels/cpu_features.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "xmoe/error.hpp"

namespace xmoe::kernels {

namespace {
constexpr int kArchGetXcompPerm = 0x1022;
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool request_amx_permission() {
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  unsigned long bitmask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &bitmask) != 0) return false;
  return (bitmask & (1ul << kXfeatureXtiledata)) != 0;
}
// CPUID 0x80000006: ECX[31:16] is one core's L2 in KiB on Intel and AMD alike.
int64_t l2_cache_bytes() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000006, &a, &b, &c, &d)) return 0;
  return int64_t{c >> 16} * 1024;
}
}  // namespace

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
  f.l2_bytes = l2_cache_bytes();
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char vendor[12];
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
    f.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  if (!os_ymm) return f;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = (b >> 5) & 1;
  if (os_zmm) {
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
  }
  const bool amx_bf16 = (d >> 22) & 1;
  const bool amx_tile = (d >> 24) & 1;
  __cpuid_count(7, 1, a, b, c, d);
  f.avx512_bf16 = os_zmm && ((a >> 5) & 1);
  if (amx_tile) {
    f.amx_tile = true;
    f.amx_bf16 = amx_bf16;
    f.amx_os_enabled = request_amx_permission();
  }
  return f;
}

std::string CpuFeatures::str() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s.push_back(' ');
    s.append(name);
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(has_avx512(), "avx512");
  add(avx512_bf16, "avx512_bf16");
  add(amx_tile && amx_bf16, amx_os_enabled ? "amx_bf16" : "amx_bf16(no-os-permission)");
  return s.empty() ? "none" : s;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::reference:
      return "reference";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512_bf16:
      return "avx512_bf16";
    case Isa::amx:
      return "amx";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  for (Isa i : {Isa::reference, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx})
    if (name == isa_name(i)) return i;
  throw Error("isa: unknown '" + name + "' (expected reference, avx2, avx512, avx512_bf16 or amx)");
}

bool isa_supported(const CpuFeatures& f, Isa isa) {
  switch (isa) {
    case Isa::reference:
      return true;
    case Isa::avx2:
      return f.has_avx2();
    case Isa::avx512:
      return f.has_avx512();
    case Isa::avx512_bf16:
      return f.has_avx512_bf16();
    case Isa::amx:
      return f.has_amx_bf16();
  }
  return false;
}

Isa best_isa(const CpuFeatures& f) {
  for (Isa i : {Isa::amx, Isa::avx512_bf16, Isa::avx512, Isa::avx2})
    if (isa_supported(f, i)) return i;
  return Isa::reference;
}

}  // namespace xmoe::kernels
