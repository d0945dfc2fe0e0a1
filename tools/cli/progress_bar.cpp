#include "tools/cli/progress_bar.hpp"

#include <unistd.h>

#include <chrono>

namespace kvo::cli {

namespace {
constexpr double kQuietSeconds = 0.5;  // shorter work shows no bar at all
constexpr double kRedrawSeconds = 0.1;
constexpr int kWidth = 30;
}  // namespace

ProgressOutput ProgressOutput::standard_error() {
  ProgressOutput o;
  o.file = stderr;
  o.terminal = ::isatty(STDERR_FILENO) != 0;
  o.now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  return o;
}

ProgressBar::ProgressBar(std::string label, double work, std::string unit, ProgressOutput output)
    : label_(std::move(label)),
      work_(work),
      unit_(std::move(unit)),
      output_(std::move(output)),
      start_(output_.now ? output_.now() : 0),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (draws_ > 0 && !finished_) std::fprintf(output_.file, "\n");
}

void ProgressBar::update(std::int64_t done, std::int64_t total) {
  if (!output_.terminal || !output_.now || finished_ || total <= 0) return;
  const double now = output_.now();
  const double elapsed = now - start_;
  const bool last = done >= total;
  if (draws_ == 0 && (elapsed < kQuietSeconds || last)) return;
  if (!last && now - last_draw_ < kRedrawSeconds) return;
  last_draw_ = now;
  draw(done, total, elapsed);
  if (last) {
    std::fprintf(output_.file, "\n");
    finished_ = true;
  }
}

void ProgressBar::draw(std::int64_t done, std::int64_t total, double elapsed) {
  ++draws_;
  const double fraction = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(fraction * kWidth);
  const double eta = fraction > 0 ? elapsed * (1 - fraction) / fraction : 0;
  std::string rate;
  if (!unit_.empty() && elapsed > 0) {
    char text[48];
    std::snprintf(text, sizeof text, " %9.0f %s/s", fraction * work_ / elapsed, unit_.c_str());
    rate = text;
  }
  std::fprintf(output_.file, "\r%s [%s%s] %3d%%%s ETA %5.1fs", label_.c_str(),
               std::string(static_cast<std::size_t>(filled), '#').c_str(),
               std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(),
               static_cast<int>(fraction * 100), rate.c_str(), eta);
  std::fflush(output_.file);
}

}  // namespace kvo::cli
