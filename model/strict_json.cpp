#include "model/strict_json.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest is for people.
std::string without_prefix(const std::string& message) {
  const std::size_t close = message.find("] ");
  return message.rfind("[json.exception.", 0) == 0 && close != std::string::npos
             ? message.substr(close + 2)
             : message;
}

}  // namespace

Json parse_json(std::string_view text, const std::string& what) {
  // One set of keys per open object: a key seen twice in the same object is an error.
  std::vector<std::set<std::string>> open_objects;
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxJsonDepth) {
      throw invalid(what + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!open_objects.back().insert(key).second) {
          throw invalid(what + ": the key \"" + printable(key) + "\" appears twice in one object");
        }
        break;
      }
      case Json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const Json::exception& e) {
    throw invalid(what + ": " + printable(without_prefix(e.what()), 240));
  }
}

std::string read_regular_file(const std::string& path, std::uint64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw invalid("cannot open " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw invalid(path + " is not a regular file");
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    throw invalid(path + " has " + std::to_string(st.st_size) + " bytes, more than the " +
                  std::to_string(max_bytes) + " such a file may have");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw invalid("cannot read " + path);
  return text.str();
}

}  // namespace kvo::model
