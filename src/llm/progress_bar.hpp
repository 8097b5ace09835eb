// A progress bar for long loads and writes: redrawn in place on a terminal, one summary line otherwise (logs
// and pipes get no carriage-return noise).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

#include "llm/checkpoint.hpp"

namespace xmoe::llm {

class ProgressBar {
 public:
  enum class Style { automatic, terminal, summary_only };
  // automatic: terminal style when `out` is a TTY, else summary_only.
  explicit ProgressBar(std::string label, std::FILE* out = stderr, Style style = Style::automatic);
  ~ProgressBar();  // finishes if update() was called and finish() was not
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // done/total in bytes; redraws at most every 100 ms (and always at 100 %).
  void update(size_t done, size_t total);
  // Prints the final state (terminal: completes the line; summary_only: "label: X GB in Y s (Z GB/s)").
  void finish();
  // A ProgressFn (LoadOptions::progress) that forwards to update(); the bar must outlive it.
  ProgressFn callback();

 private:
  void draw(bool final_line);

  std::string label_;
  std::FILE* out_;
  bool terminal_;
  bool started_ = false, finished_ = false;
  size_t done_ = 0, total_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace xmoe::llm
