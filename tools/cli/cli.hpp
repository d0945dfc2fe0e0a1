// The command line of every tool, on CLI11: typed options whose ranges and defaults are written
// in --help, numbers read strictly (the whole text, in decimal, nothing after it), and one
// exit-status convention for all of them:
//   0  success
//   1  a failure while running: a malformed model file, memory that does not suffice, a device
//      error, a check that failed
//   2  a usage error: an unknown option, a malformed or out-of-range value, options that exclude
//      each other, a prompt that does not fit the model
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvo::cli {

inline constexpr int kExitSuccess = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A usage error found after the options were read (a value that does not fit the model, two
// options that do not go together). Exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The convention above as --help prints it.
extern const char* const kExitStatusHelp;

// Strict readers: true only when the whole text is the value.
bool read_integer(const std::string& text, std::int64_t& value);  // -?[0-9]+, no overflow
bool read_real(const std::string& text, double& value);  // decimal or exponent form, finite

// A token count: an integer with an optional binary suffix k, m or g (4096, 128k, 1m, 1g).
bool read_token_count(const std::string& text, std::int64_t& value);
// The same, or a UsageError naming `what` and the text when it is malformed or outside
// [min, max].
std::int64_t parse_token_count(const std::string& text, std::int64_t min, std::int64_t max,
                               const std::string& what);

// Options whose help says the type, the range and the default (the bound value when declared).
// Values are checked, and rewritten to plain decimal, before CLI11 converts them.
CLI::Option* add_integer(CLI::App& app, const std::string& name, int& value, int min, int max,
                         const std::string& help);
CLI::Option* add_integer(CLI::App& app, const std::string& name, std::uint64_t& value,
                         std::uint64_t min, std::uint64_t max, const std::string& help);
CLI::Option* add_real(CLI::App& app, const std::string& name, double& value, double min, double max,
                      const std::string& help);
// Bytes, as kvo::parse_size reads them (24GiB, 512MiB, 1.5GB, 4096).
CLI::Option* add_size(CLI::App& app, const std::string& name, std::uint64_t& value,
                      std::uint64_t min, const std::string& help);
// Tokens, as parse_token_count reads them.
CLI::Option* add_tokens(CLI::App& app, const std::string& name, int& value, int min, int max,
                        const std::string& help);
// One of `names`.
CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        const std::vector<std::string>& names, const std::string& help);
CLI::Option* add_text(CLI::App& app, const std::string& name, std::string& value,
                      const std::string& type, const std::string& help);
CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& value, const std::string& help);

// Files a tool writes besides its output (--json, --csv, --svg). A path that is absent or a
// regular file is written whole or not at all (a partial file beside it, renamed when complete);
// anything else that takes writes (/dev/stdout, a FIFO with a reader) is written in place; a
// directory, or a FIFO nobody reads, is refused. check_output_path() refuses, before the work,
// a path that could not be written (its directory missing or read-only, say); write_output_file()
// reports every write error ("/dev/full: No space left on device") as kvo::Error. `option`
// names the option in messages.
void check_output_path(const std::string& path, const std::string& option);
void write_output_file(const std::string& path, const std::string& text, const std::string& option);

// All of standard input, at most `max_bytes` (a UsageError beyond: /dev/zero is not a prompt).
std::string read_standard_input(std::uint64_t max_bytes);

// Prepares `app` as a tool: its description and the exit-status footer.
void describe(CLI::App& app, const std::string& description);

// Reads the command line into `app`'s options, then runs `body`, and turns what happens into
// the exit status: --help prints the help (0); a parse error or a UsageError prints
// "<tool>: <message>" and where to find the options (2); any other error prints
// "<tool>: <message>" (1). Output that could not be written (a full disk, a closed pipe) is an
// error too.
int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace kvo::cli
