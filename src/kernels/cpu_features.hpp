// What this CPU and OS let us run, detected at run time (never from the build machine).
#pragma once
#include <cstdint>
#include <string>

namespace xmoe::kernels {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_os_enabled = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded
  int64_t l2_bytes = 0;         // one core's L2 (CPUID 0x80000006, Intel and AMD alike); 0: not reported
  bool amd = false;  // CPUID vendor "AuthenticAMD" (kernel tables tuned on Zen 4; kernel_table.cpp)

  bool has_avx2() const { return avx2 && fma; }
  bool has_avx512() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  bool has_avx512_bf16() const { return has_avx512() && avx512_bf16; }
  bool has_amx_bf16() const { return amx_tile && amx_bf16 && amx_os_enabled; }
  std::string str() const;  // "avx2 fma avx512 avx512_bf16 ..."
};

// Detected once per call; asks the OS for AMX tile permission when the CPU has AMX.
CpuFeatures detect_cpu_features();

// Instruction-set levels a kernel variant can be built for, lowest first.
enum class Isa { reference = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3, amx = 4 };
const char* isa_name(Isa isa);
Isa parse_isa(const std::string& name);  // throws xmoe::Error naming the value
Isa best_isa(const CpuFeatures& f);
bool isa_supported(const CpuFeatures& f, Isa isa);

}  // namespace xmoe::kernels
