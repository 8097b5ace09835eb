// The xmoe command line as a user runs it: exit codes and messages.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include "cli_runner.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

using xmoe::testing_cli::CliRun;
using xmoe::testing_cli::run_cli;

TEST(Cli, BenchRunsSmallTrainingAndPrintsTutelLines) {
  CliRun r = run_cli(
      "bench --batch_size 2 --num_tokens 16 --model_dim 32 --hidden_size 24 --num_local_experts 4 "
      "--num_steps 3 --threads 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[Statistics] param count for MoE local_experts = 6368"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("STEP-2: loss = "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[Summary]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[Phases]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[Experts]"), std::string::npos) << r.output;
}

TEST(Cli, BenchEvalDroplessBf16AndSwitching) {
  CliRun r = run_cli(
      "bench --batch_size 2 --num_tokens 16 --model_dim 32 --hidden_size 24 --num_steps 2 --eval "
      "--dropless --dtype bfloat16 --expert_type swiglu --measure_switching");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("execution = grouped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[Switching]"), std::string::npos) << r.output;
}

// libgomp reads its wait policy before main: xmoe's bounded-spin default reaches it only through a fresh
// exec, which must keep the arguments; a policy from the environment is left as it is.
TEST(Cli, OpenMpWaitDefaultsToABoundedSpinUnlessTheEnvironmentChooses) {
  CliRun r = run_cli("info", "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("openmp wait: GOMP_SPINCOUNT=10000 (xmoe's default"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kernel level: "), std::string::npos) << r.output;
  r = run_cli("info", "-u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("openmp wait: OMP_WAIT_POLICY=passive\n"), std::string::npos) << r.output;
  r = run_cli("info", "-u OMP_WAIT_POLICY GOMP_SPINCOUNT=77");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("openmp wait: GOMP_SPINCOUNT=77\n"), std::string::npos) << r.output;
  // the exec keeps every argument: a bad flag is still named
  r = run_cli("info --no-such-flag", "-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--no-such-flag"), std::string::npos) << r.output;
}

TEST(Cli, BadFlagsExitTwoWithTheMessage) {
  const std::pair<const char*, const char*> cases[] = {
      {"bench --top 0", "--top"},
      {"bench --top 3 --num_local_experts 2", "--top"},
      {"bench --model_dim -5", "--model_dim"},
      {"bench --dtype float16", "--dtype"},
      {"bench --no_such_flag", "--no_such_flag"},
      {"bench --num_steps x", "--num_steps"},
      {"bench --expert_type moe", "--expert_type"},
  };
  for (auto [args, needle] : cases) {
    CliRun r = run_cli(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
