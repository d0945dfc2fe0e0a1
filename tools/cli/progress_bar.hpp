// A one-line progress bar, for work that takes long enough to wonder about: it stays silent
// unless its output is a terminal, appears only once the work has run for half a second, and
// redraws at most ten times a second however often it is told.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace kvo::cli {

// Where a bar draws and how it tells time.
struct ProgressOutput {
  std::FILE* file = stderr;
  bool terminal = false;        // nothing is drawn unless this is set
  std::function<double()> now;  // seconds on a monotonic clock
  // stderr, whether it is a terminal, and the steady clock.
  static ProgressOutput standard_error();
};

class ProgressBar {
 public:
  // `label` starts the line ("prefill", "writing"); `work` units of `unit` are done in all,
  // for the rate ("tok" gives tok/s; an empty unit shows no rate).
  ProgressBar(std::string label, double work, std::string unit,
              ProgressOutput output = ProgressOutput::standard_error());
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` steps are finished; the last call (done == total) ends the line.
  void update(std::int64_t done, std::int64_t total);
  int draws() const { return draws_; }

 private:
  void draw(std::int64_t done, std::int64_t total, double elapsed);

  std::string label_;
  double work_;
  std::string unit_;
  ProgressOutput output_;
  bool finished_ = false;
  int draws_ = 0;
  double start_;
  double last_draw_;
};

}  // namespace kvo::cli
