// Runs the xmoe binary (its path is fixed at build time) as a user would, capturing exit code and output.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace xmoe::testing_cli {

struct CliRun {
  int code = -1;
  std::string output;  // stdout and stderr
};

// env_prefix: `env` arguments run before the binary (e.g. "-u OMP_WAIT_POLICY X=1"), empty for none.
inline CliRun run_cli(const std::string& args, const std::string& env_prefix = "") {
  CliRun r;
  const std::string env = env_prefix.empty() ? "" : "env " + env_prefix + " ";
  FILE* p = popen((env + XMOE_CLI_PATH + " " + args + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace xmoe::testing_cli
