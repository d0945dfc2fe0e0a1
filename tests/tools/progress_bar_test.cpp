// The progress bar: silent off a terminal and for short work, then redrawn often enough to move
// and never more than ten times a second, ending its line once.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tools/cli/progress_bar.hpp"

namespace kvo::cli {
namespace {

// A bar on a temporary file with a clock the test moves.
struct Harness {
  std::FILE* file = std::tmpfile();
  double clock = 100;
  ProgressOutput output(bool terminal) {
    ProgressOutput o;
    o.file = file;
    o.terminal = terminal;
    o.now = [this] { return clock; };
    return o;
  }
  std::string text() {
    std::fflush(file);
    std::rewind(file);
    std::string s;
    for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) s += static_cast<char>(c);
    return s;
  }
  ~Harness() { std::fclose(file); }
};

TEST(ProgressBar, MovesWithEveryChunkOfALongPrefill) {
  Harness h;
  {
    // 4 layers x 128 chunks, 1/64 s each: 8 s of prefill.
    ProgressBar bar("prefill", 8192, "tok", h.output(true));
    for (int i = 1; i <= 512; ++i) {
      h.clock += 1.0 / 64;
      bar.update(i, 512);
    }
    // Silent for the first half second (32 chunks), then a draw every 7 chunks (the first
    // 1/64 multiple past 0.1 s), and the last one: (512 - 32) / 7 = 68, plus 2.
    EXPECT_EQ(bar.draws(), 70);
  }
  const std::string text = h.text();
  EXPECT_NE(text.find("\rprefill [##############################] 100%"), std::string::npos);
  EXPECT_NE(text.find("tok/s"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find('\n'), text.size() - 1);  // one line, ended once
}

TEST(ProgressBar, SilentOffATerminalAndForShortWork) {
  Harness h;
  {
    ProgressBar off("weights", 0, "", h.output(false));
    for (int i = 1; i <= 100; ++i) {
      h.clock += 1;
      off.update(i, 100);
    }
    EXPECT_EQ(off.draws(), 0);
    ProgressBar quick("weights", 0, "", h.output(true));
    for (int i = 1; i <= 100; ++i) {
      h.clock += 0.001;  // 0.1 s in all
      quick.update(i, 100);
    }
    EXPECT_EQ(quick.draws(), 0);
  }
  EXPECT_EQ(h.text(), "");
}

TEST(ProgressBar, AnInterruptedBarStillEndsItsLine) {
  Harness h;
  {
    ProgressBar bar("writing", 0, "", h.output(true));
    h.clock += 1;
    bar.update(1, 10);
    EXPECT_EQ(bar.draws(), 1);
  }
  const std::string text = h.text();
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(text.find("MB/s"), std::string::npos);
}

}  // namespace
}  // namespace kvo::cli
