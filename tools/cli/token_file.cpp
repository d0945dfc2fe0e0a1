#include "tools/cli/token_file.hpp"

#include "kvoffload/error.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"

namespace kvo::cli {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

class LineReader {
 public:
  LineReader(std::string_view line, const std::string& source, int line_no)
      : line_(line), source_(source), line_no_(line_no) {}

  std::vector<std::int32_t> ids() {
    std::vector<std::int32_t> out;
    skip_blanks();
    if (at_end()) return out;
    while (true) {
      out.push_back(id());
      skip_blanks();
      if (at_end()) return out;
      if (line_[pos_] == ',') {
        ++pos_;
        skip_blanks();
        if (at_end()) fail("a comma ends the line (no id after it)");
        if (line_[pos_] == ',') fail("an empty id between two commas");
      }  // else blanks separated the ids (id() allows nothing else after one)
    }
  }

 private:
  bool at_end() const { return pos_ >= line_.size(); }
  void skip_blanks() {
    while (!at_end() && is_blank(line_[pos_])) ++pos_;
  }
  [[noreturn]] void fail(const std::string& problem) const {
    throw UsageError(source_ + ":" + std::to_string(line_no_) + ":" + std::to_string(pos_ + 1) +
                     ": " + problem);
  }
  [[noreturn]] void unexpected() const {
    if (line_[pos_] == ',') fail("a comma before the first id");
    fail("'" + kvo::printable(line_.substr(pos_, 1)) +
         "' is not part of a token id (ids are decimal integers from 0 to 2147483647)");
  }
  std::int32_t id() {
    if (at_end() || !is_digit(line_[pos_])) unexpected();
    std::int64_t value = 0;
    const std::size_t start = pos_;
    while (!at_end() && is_digit(line_[pos_])) {
      value = value * 10 + (line_[pos_] - '0');
      if (value > INT32_MAX) {
        pos_ = start;
        fail("token id " + kvo::printable(line_.substr(start, 24)) + " is larger than 2147483647");
      }
      ++pos_;
    }
    if (!at_end() && !is_blank(line_[pos_]) && line_[pos_] != ',') unexpected();
    return static_cast<std::int32_t>(value);
  }

  std::string_view line_;
  const std::string& source_;
  int line_no_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::vector<std::int32_t>> parse_token_ids(std::string_view text,
                                                       const std::string& source) {
  std::vector<std::vector<std::int32_t>> prompts;
  std::int64_t total = 0;
  int line_no = 0;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    ++line_no;
    std::vector<std::int32_t> ids =
        LineReader(text.substr(start, end - start), source, line_no).ids();
    total += static_cast<std::int64_t>(ids.size());
    if (total > kMaxTokenFileIds) {
      throw UsageError(source + ": more than " + std::to_string(kMaxTokenFileIds) + " token ids");
    }
    if (!ids.empty()) prompts.push_back(std::move(ids));
    start = end + 1;
  }
  if (prompts.empty()) throw UsageError(source + " holds no token ids");
  return prompts;
}

std::vector<std::vector<std::int32_t>> read_token_file(const std::string& path) {
  std::string text;
  try {
    // Eleven bytes per id at most ("2147483647,"): a larger file cannot be a valid one.
    text = offload::read_input_file(path, kMaxTokenFileBytes, "the token file");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return parse_token_ids(text, path);
}

}  // namespace kvo::cli
