#include "llm/progress_bar.hpp"

#include <unistd.h>

#include <algorithm>

namespace xmoe::llm {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

ProgressBar::ProgressBar(std::string label, std::FILE* out, Style style)
    : label_(std::move(label)),
      out_(out),
      terminal_(style == Style::terminal || (style == Style::automatic && out && ::isatty(::fileno(out)))) {}

ProgressBar::~ProgressBar() {
  if (started_ && !finished_) finish();
}

void ProgressBar::update(size_t done, size_t total) {
  const auto now = std::chrono::steady_clock::now();
  if (!started_) {
    started_ = true;
    start_ = now;
    last_draw_ = now - std::chrono::seconds(1);
  }
  done_ = std::min(done, total);
  total_ = total;
  if (!terminal_) return;
  if (done_ == total_ || seconds_between(last_draw_, now) >= 0.1) {
    last_draw_ = now;
    draw(false);
  }
}

void ProgressBar::finish() {
  if (finished_ || !out_) return;
  finished_ = true;
  if (!started_) {
    started_ = true;
    start_ = std::chrono::steady_clock::now();
  }
  draw(true);
}

ProgressFn ProgressBar::callback() {
  return [this](size_t done, size_t total) { update(done, total); };
}

void ProgressBar::draw(bool final_line) {
  if (!out_) return;
  const double elapsed = seconds_between(start_, std::chrono::steady_clock::now());
  const double gb_done = static_cast<double>(done_) / 1e9, gb_total = static_cast<double>(total_) / 1e9;
  const double rate = elapsed > 0 ? gb_done / elapsed : 0.0;
  if (!terminal_) {
    std::fprintf(out_, "%s: %.2f GB in %.1f s (%.2f GB/s)\n", label_.c_str(), gb_done, elapsed, rate);
    std::fflush(out_);
    return;
  }
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '-');
  const double eta = rate > 0 && !final_line ? (gb_total - gb_done) / rate : 0.0;
  // \r redraws the line; the trailing spaces clear what a longer previous line left.
  std::fprintf(out_, "\r%s [%s] %5.1f%% %.2f/%.2f GB %.2f GB/s ETA %.0f s   ", label_.c_str(), bar.c_str(),
               100.0 * frac, gb_done, gb_total, rate, eta);
  if (final_line) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace xmoe::llm
