// A small command-line reader shared by the tools: --name value, --name=value and bare flags.
// Unknown options, missing values and malformed numbers are errors that name the option.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvo::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // `valued`: options that take a value; `flags`: options that do not.
  Args(int argc, char** argv, const std::set<std::string>& valued,
       const std::set<std::string>& flags);

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  std::int64_t get_int(const std::string& name, std::int64_t fallback, std::int64_t min,
                       std::int64_t max) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace kvo::cli
