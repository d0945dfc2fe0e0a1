// The tools' command line: numbers are read whole and strictly, ranges and sizes are checked
// with the option named, and every outcome maps to the one exit-status convention.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "tools/cli/cli.hpp"

namespace kvo::cli {
namespace {

TEST(Cli, IntegersAreReadWhole) {
  std::int64_t v = 0;
  EXPECT_TRUE(read_integer("42", v));
  EXPECT_EQ(v, 42);
  EXPECT_TRUE(read_integer("-7", v));
  EXPECT_EQ(v, -7);
  EXPECT_TRUE(read_integer("010", v));
  EXPECT_EQ(v, 10);  // decimal, never octal
  for (const char* bad :
       {"", "-", "+1", " 1", "1 ", "1.5", "0x10", "1e3", "abc", "12abc", "99999999999999999999"}) {
    EXPECT_FALSE(read_integer(bad, v)) << bad;
  }
}

TEST(Cli, RealsAreReadWholeAndFinite) {
  double v = 0;
  for (const auto& [text, value] : std::vector<std::pair<const char*, double>>{{"0.5", 0.5},
                                                                               {"1", 1},
                                                                               {".25", 0.25},
                                                                               {"2.", 2},
                                                                               {"1e-3", 1e-3},
                                                                               {"-3.5E2", -350},
                                                                               {"1e-400", 0}}) {
    EXPECT_TRUE(read_real(text, v)) << text;
    EXPECT_DOUBLE_EQ(v, value) << text;
  }
  for (const char* bad : {"", "abc", "0.5xyz", "1e999", "-1e999", "nan", "inf", "0x1p3", " 1", "1 ",
                          ".", "e5", "1e", "1e+", "1.2.3", "--1"}) {
    EXPECT_FALSE(read_real(bad, v)) << bad;
  }
}

TEST(Cli, TokenCountsTakeBinarySuffixesUpToTheirLimit) {
  EXPECT_EQ(parse_token_count("4096", 1, 1 << 30, "--x"), 4096);
  EXPECT_EQ(parse_token_count("4k", 1, 1 << 30, "--x"), 4096);
  EXPECT_EQ(parse_token_count("128K", 1, 1 << 30, "--x"), 131072);
  EXPECT_EQ(parse_token_count("1m", 1, 1 << 30, "--x"), 1 << 20);
  EXPECT_EQ(parse_token_count("1g", 1, 1 << 30, "--x"), 1 << 30);  // the limit, as it says
  EXPECT_EQ(parse_token_count("1024m", 1, 1 << 30, "--x"), 1 << 30);
  for (const char* bad :
       {"1025m", "2g", "0", "", "k", "1.5k", "4kk", "-4k", "4kb", "12q", "99999999999999999999g"}) {
    try {
      parse_token_count(bad, 1, 1 << 30, "--contexts");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--contexts needs a token count from 1 to 1073741824"),
                std::string::npos)
          << e.what();
    }
  }
}

// Runs an app with `args` and returns the exit status and what it printed on stderr.
struct Outcome {
  int status;
  std::string err;
};
Outcome run_with(
    CLI::App& app, std::vector<std::string> args,
    const std::function<int()>& body = [] { return 0; }) {
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int status = run(app, static_cast<int>(argv.size()), argv.data(), body);
  ::testing::internal::GetCapturedStdout();
  return {status, ::testing::internal::GetCapturedStderr()};
}

struct Values {
  int n = 1;
  double x = 0;
  std::uint64_t bytes = 0;
  int tokens = 8;
  std::string name = "b";
  bool flag = false;
};

void declare(CLI::App& app, Values& v) {
  describe(app, "test tool");
  add_integer(app, "--n", v.n, 1, 4096, "a count");
  add_real(app, "--x", v.x, 0, 100, "a number");
  add_size(app, "--bytes", v.bytes, 1, "a size");
  add_tokens(app, "--tokens", v.tokens, 1, 1 << 30, "a token count");
  add_choice(app, "--name", v.name, {"a", "b"}, "a choice");
  add_flag(app, "--flag", v.flag, "a flag");
}

TEST(Cli, OptionsAreTypedAndCheckedWithTheirNames) {
  {
    CLI::App app("", "tool");
    Values v;
    declare(app, v);
    const Outcome o = run_with(app, {"--n", "010", "--x", "2.5", "--bytes", "1.5GiB", "--tokens",
                                     "128k", "--name=a", "--flag"});
    EXPECT_EQ(o.status, kExitSuccess) << o.err;
    EXPECT_EQ(v.n, 10);
    EXPECT_DOUBLE_EQ(v.x, 2.5);
    EXPECT_EQ(v.bytes, 3ull << 29);
    EXPECT_EQ(v.tokens, 131072);
    EXPECT_EQ(v.name, "a");
    EXPECT_TRUE(v.flag);
  }
  const struct {
    std::vector<std::string> args;
    const char* message;
  } usage[] = {
      {{"--n", "abc"}, "--n: needs an integer from 1 to 4096, got 'abc'"},
      {{"--n", "0"}, "--n: needs an integer from 1 to 4096, got '0'"},
      {{"--n", "1.5"}, "--n: needs an integer from 1 to 4096, got '1.5'"},
      {{"--x", "abc"}, "--x: needs a number from 0 to 100, got 'abc'"},
      {{"--x", "0.5xyz"}, "--x: needs a number from 0 to 100, got '0.5xyz'"},
      {{"--x", "1e999"}, "--x: needs a number from 0 to 100, got '1e999'"},
      {{"--x", ""}, "--x: needs a number from 0 to 100, got ''"},
      {{"--bytes", "24XB"}, "cannot read the size '24XB'"},
      {{"--bytes", "0"}, "--bytes: needs at least 1 B, got '0'"},
      {{"--tokens", "1025m"}, "--tokens: needs a token count from 1 to 1073741824"},
      {{"--name", "c"}, "--name: needs one of a, b, got 'c'"},
      {{"--n", "\x1b[31m"}, "got '\\x1b[31m'"},
      {{"--unknown"}, "--unknown"},
      {{"--n", "1", "--n", "2"}, "--n"},
      {{"--flag=1"}, "flag was given a disallowed flag override"},
  };
  for (const auto& u : usage) {
    CLI::App app("", "tool");
    Values v;
    declare(app, v);
    const Outcome o = run_with(app, u.args);
    EXPECT_EQ(o.status, kExitUsage) << u.message;
    EXPECT_NE(o.err.find(u.message), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("Run 'tool --help' for the options."), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find('\x1b'), std::string::npos) << "raw escape echoed";
  }
}

TEST(Cli, OneExitStatusConvention) {
  const auto status_of = [](const std::function<int()>& body) {
    CLI::App app("", "tool");
    Values v;
    declare(app, v);
    return run_with(app, {}, body);
  };
  EXPECT_EQ(status_of([] { return kExitSuccess; }).status, 0);
  EXPECT_EQ(status_of([]() -> int { throw UsageError("--a and --b exclude each other"); }).status,
            2);
  const Outcome failure =
      status_of([]() -> int { throw Error(ErrorCode::kOutOfMemory, "the plan needs 4 TiB"); });
  EXPECT_EQ(failure.status, 1);
  EXPECT_EQ(failure.err, "tool: the plan needs 4 TiB\n");
  EXPECT_EQ(status_of([]() -> int { throw std::bad_alloc(); }).status, 1);
  // --help prints the convention and succeeds.
  CLI::App app("", "tool");
  Values v;
  declare(app, v);
  ::testing::internal::CaptureStdout();
  char name[] = "tool", help[] = "--help";
  char* argv[] = {name, help};
  EXPECT_EQ(run(app, 2, argv, [] { return 7; }), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("Exit status: 0 success; 1 a failure while running"), std::string::npos);
  EXPECT_NE(out.find("2 a usage error"), std::string::npos);
  EXPECT_NE(out.find("--n N"), std::string::npos);
  EXPECT_NE(out.find("1 to 4096"), std::string::npos);
}

}  // namespace
}  // namespace kvo::cli
