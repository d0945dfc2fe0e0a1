#include "tools/cli/cli.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <stdexcept>
#include <system_error>

#include "kvoffload/error.hpp"
#include "kvoffload/types.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/partial_files.hpp"
#include "offload/util/printable.hpp"

namespace kvo::cli {

const char* const kExitStatusHelp =
    "Exit status: 0 success; 1 a failure while running (a malformed model file, not enough\n"
    "memory, a device error, a failed check); 2 a usage error (an unknown option, a malformed or\n"
    "out-of-range value, options that exclude each other, a prompt that does not fit the model).";

namespace {

bool all_digits(const std::string& text, std::size_t from) {
  if (from >= text.size()) return false;
  for (std::size_t i = from; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return true;
}

std::string shown_text(const std::string& text) {
  return "'" + kvo::printable(text) + "'";
}

template <typename T>
std::string with_default(const std::string& help, const T& value) {
  return help + " (default " + std::to_string(value) + ")";
}

}  // namespace

bool read_integer(const std::string& text, std::int64_t& value) {
  const std::size_t start = !text.empty() && text[0] == '-' ? 1 : 0;
  if (!all_digits(text, start)) return false;
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || end != text.c_str() + text.size()) return false;
  value = parsed;
  return true;
}

bool read_real(const std::string& text, double& value) {
  // Decimal digits, one optional point, an optional exponent: what strtod reads, without its
  // leading spaces, hexadecimal, "inf" or "nan".
  std::size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  std::size_t digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (!all_digits(text, i)) return false;
    i = text.size();
  }
  if (i != text.size()) return false;
  char* end = nullptr;
  const double parsed = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(parsed)) return false;
  value = parsed;
  return true;
}

bool read_token_count(const std::string& text, std::int64_t& value) {
  std::string digits = text;
  int shift = 0;
  if (!digits.empty()) {
    const char unit = digits.back();
    shift = unit == 'k' || unit == 'K'   ? 10
            : unit == 'm' || unit == 'M' ? 20
            : unit == 'g' || unit == 'G' ? 30
                                         : 0;
    if (shift != 0) digits.pop_back();
  }
  std::int64_t count = 0;
  if (!all_digits(digits, 0) || !read_integer(digits, count) || count > (INT64_MAX >> shift)) {
    return false;
  }
  value = count << shift;
  return true;
}

namespace {

std::string token_count_problem(const std::string& text, std::int64_t min, std::int64_t max) {
  std::int64_t value = 0;
  if (read_token_count(text, value) && value >= min && value <= max) return {};
  return "needs a token count from " + std::to_string(min) + " to " + std::to_string(max) +
         " (e.g. 4096, 4k, 128k, 1m, 1g), got " + shown_text(text);
}

}  // namespace

std::int64_t parse_token_count(const std::string& text, std::int64_t min, std::int64_t max,
                               const std::string& what) {
  const std::string problem = token_count_problem(text, min, max);
  if (!problem.empty()) throw UsageError(what + " " + problem);
  std::int64_t value = 0;
  read_token_count(text, value);
  return value;
}

CLI::Option* add_integer(CLI::App& app, const std::string& name, int& value, int min, int max,
                         const std::string& help) {
  CLI::Validator check(
      [min, max](std::string& text) -> std::string {
        std::int64_t v = 0;
        if (!read_integer(text, v) || v < min || v > max) {
          return "needs an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                 ", got " + shown_text(text);
        }
        text = std::to_string(v);  // CLI11 would read "010" as octal
        return {};
      },
      "");
  return app
      .add_option(
          name, value,
          with_default(help, value) + "; " + std::to_string(min) + " to " + std::to_string(max))
      ->type_name("N")
      ->transform(check);
}

CLI::Option* add_integer(CLI::App& app, const std::string& name, std::uint64_t& value,
                         std::uint64_t min, std::uint64_t max, const std::string& help) {
  CLI::Validator check(
      [min, max](std::string& text) -> std::string {
        const bool digits = all_digits(text, 0);
        errno = 0;
        char* end = nullptr;
        const unsigned long long v = digits ? std::strtoull(text.c_str(), &end, 10) : 0;
        if (!digits || errno == ERANGE || v < min || v > max) {
          return "needs an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                 ", got " + shown_text(text);
        }
        text = std::to_string(v);
        return {};
      },
      "");
  return app.add_option(name, value, with_default(help, value))->type_name("N")->transform(check);
}

CLI::Option* add_real(CLI::App& app, const std::string& name, double& value, double min, double max,
                      const std::string& help) {
  char range[96];
  std::snprintf(range, sizeof range, "%g to %g", min, max);
  const std::string range_text = range;
  CLI::Validator check(
      [min, max, range_text](std::string& text) -> std::string {
        double v = 0;
        if (!read_real(text, v) || v < min || v > max) {
          return "needs a number from " + range_text + ", got " + shown_text(text);
        }
        return {};
      },
      "");
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", value);
  return app.add_option(name, value, help + " (default " + shown + "); " + range_text)
      ->type_name("X")
      ->transform(check);
}

CLI::Option* add_size(CLI::App& app, const std::string& name, std::uint64_t& value,
                      std::uint64_t min, const std::string& help) {
  CLI::Validator check(
      [min](std::string& text) -> std::string {
        std::uint64_t bytes = 0;
        try {
          bytes = parse_size(text);
        } catch (const Error& e) {
          return e.what();
        }
        if (bytes < min) {
          return "needs at least " + format_bytes(min) + ", got " + shown_text(text);
        }
        text = std::to_string(bytes);
        return {};
      },
      "");
  return app.add_option(name, value, help)->type_name("SIZE")->transform(check);
}

CLI::Option* add_tokens(CLI::App& app, const std::string& name, int& value, int min, int max,
                        const std::string& help) {
  CLI::Validator check(
      [min, max](std::string& text) -> std::string {
        const std::string problem = token_count_problem(text, min, max);
        if (!problem.empty()) return problem;
        std::int64_t count = 0;
        read_token_count(text, count);
        text = std::to_string(count);
        return {};
      },
      "");
  return app
      .add_option(name, value,
                  with_default(help, value) + "; " + std::to_string(min) + " to " +
                      std::to_string(max) + ", or with k, m, g (x1024)")
      ->type_name("N")
      ->transform(check);
}

CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& value,
                        const std::vector<std::string>& names, const std::string& help) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  CLI::Validator check(
      [names, list](std::string& text) -> std::string {
        for (const auto& n : names) {
          if (text == n) return {};
        }
        return "needs one of " + list + ", got " + shown_text(text);
      },
      "");
  return app
      .add_option(name, value,
                  help + (value.empty() ? "" : " (default " + value + ")") + "; " + list)
      ->type_name("NAME")
      ->transform(check);
}

CLI::Option* add_text(CLI::App& app, const std::string& name, std::string& value,
                      const std::string& type, const std::string& help) {
  return app.add_option(name, value, help)->type_name(type);
}

CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& value,
                      const std::string& help) {
  return app.add_flag(name, value, help)->disable_flag_override();
}

namespace {

// A path that is not a regular file but takes writes, opened for them; -1 with errno otherwise.
int open_special(const std::string& path) {
  // Non-blocking: a FIFO without a reader fails at once (ENXIO) instead of waiting for one.
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return -1;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

bool is_special(const std::string& path, struct stat& st) {
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

Error output_error(const std::string& option, const std::string& path, const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, option + " " + printable(path, 200) + ": " + what);
}

}  // namespace

void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty()) throw UsageError(option + ": an empty path");
  struct stat st {};
  if (is_special(path, st)) {
    if (S_ISDIR(st.st_mode))
      throw UsageError(option + " " + printable(path, 200) + " is a directory");
    const int fd = open_special(path);
    if (fd < 0) {
      throw UsageError(option + " " + printable(path, 200) +
                       ": cannot write it: " + std::strerror(errno));
    }
    ::close(fd);
    return;
  }
  try {
    offload::AtomicFileSink::check_path(path);
  } catch (const Error& e) {
    throw UsageError(option + ": " + e.what());
  }
}

void write_output_file(const std::string& path, const std::string& text,
                       const std::string& option) {
  struct stat st {};
  if (!is_special(path, st)) {
    try {
      offload::AtomicFileSink sink(path);
      sink.write(text.data(), text.size());
      sink.commit();
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, option + ": " + e.what());
    }
    return;
  }
  if (S_ISDIR(st.st_mode)) throw output_error(option, path, "is a directory");
  const int fd = open_special(path);
  if (fd < 0)
    throw output_error(option, path, std::string("cannot write it: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      throw output_error(option, path, std::string("failed writing it: ") + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    throw output_error(option, path, std::string("failed writing it: ") + std::strerror(errno));
  }
}

std::string read_standard_input(std::uint64_t max_bytes) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("cannot read standard input: ") + std::strerror(errno));
    }
    if (n == 0) return text;
    if (text.size() + static_cast<std::size_t>(n) > max_bytes) {
      throw UsageError("standard input holds more than " + std::to_string(max_bytes) +
                       " bytes, the most this tool reads");
    }
    text.append(buffer, static_cast<std::size_t>(n));
  }
}

void describe(CLI::App& app, const std::string& description) {
  app.description(description);
  app.footer(kExitStatusHelp);
  app.get_formatter()->column_width(28);
}

int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  // An interrupted tool leaves no partial file behind; a write past ulimit -f is an error.
  offload::install_partial_cleanup();
  const std::string tool = app.get_name();
  const auto usage = [&](const std::string& message) {
    std::cerr << tool << ": " << message << "\nRun '" << tool << " --help' for the options.\n";
    return kExitUsage;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return kExitSuccess;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return kExitSuccess;
    return usage(e.what());
  } catch (const std::exception& e) {
    // A check of a value that failed in a way it should not have: still the value's fault.
    return usage(e.what());
  }
  try {
    const int status = body();
    // What the tool printed must have reached its destination.
    std::cout.flush();
    if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::cerr << tool << ": cannot write the output: " << std::strerror(errno) << "\n";
      return kExitFailure;
    }
    return status;
  } catch (const UsageError& e) {
    return usage(e.what());
  } catch (const Error& e) {
    std::cerr << tool << ": " << e.what() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << tool << ": out of memory\n";
  } catch (const std::length_error&) {
    std::cerr << tool << ": out of memory (a size larger than any allocation can be)\n";
  } catch (const std::system_error& e) {
    // Threads that cannot start (ulimit -u), say: the system's reason, not the library's text.
    std::cerr << tool << ": the system refused a resource: " << e.code().message() << "\n";
  } catch (const std::exception& e) {
    std::cerr << tool << ": internal error, please report it: " << kvo::printable(e.what(), 200)
              << "\n";
  }
  return kExitFailure;
}

}  // namespace kvo::cli
