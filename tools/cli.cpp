#include "tools/cli.hpp"

namespace kvo::cli {

Args::Args(int argc, char** argv, const std::set<std::string>& valued,
           const std::set<std::string>& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "'");
    std::string name = arg.substr(2);
    std::string value;
    bool inline_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (flags.count(name) != 0) {
      if (inline_value) throw UsageError("--" + name + " takes no value");
      values_[name] = "1";
    } else if (valued.count(name) != 0) {
      if (!inline_value) {
        if (i + 1 >= argc) throw UsageError("--" + name + " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      throw UsageError("unknown option --" + name);
    }
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::int64_t Args::get_int(const std::string& name, std::int64_t fallback, std::int64_t min,
                           std::int64_t max) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != it->second.size()) {
    throw UsageError("--" + name + " needs an integer, got '" + it->second + "'");
  }
  if (value < min || value > max) {
    throw UsageError("--" + name + " must be between " + std::to_string(min) + " and " +
                     std::to_string(max) + ", got " + it->second);
  }
  return value;
}

}  // namespace kvo::cli
