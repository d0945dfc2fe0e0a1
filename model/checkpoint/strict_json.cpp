#include "model/checkpoint/strict_json.hpp"

#include <cmath>
#include <set>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/printable.hpp"

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
  return offload::read_input_file(path, max_bytes);
}

namespace {

bool is_identifier(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

JsonField::JsonField(const Json& root, const std::string& file)
    : value_(&root), file_(std::make_shared<const std::string>(file)) {}

std::string JsonField::field() const {
  return field_.empty() ? "(the document)" : field_;
}

Error JsonField::error(const std::string& problem) const {
  return invalid(*file_ + ": " + field() + ": " + problem);
}

std::string JsonField::shown() const {
  return printable(value_->dump(-1, ' ', false, Json::error_handler_t::replace), 80);
}

JsonField JsonField::child(const Json& value, const std::string& key) const {
  std::string name = field_;
  if (is_identifier(key)) {
    if (!name.empty()) name += '.';
    name += key;
  } else {
    name += "[\"" + printable(key, 48) + "\"]";
  }
  return JsonField(value, file_, std::move(name));
}

void JsonField::require_object() const {
  if (!value_->is_object()) throw error("must be a JSON object, got " + shown());
}

void JsonField::require_array() const {
  if (!value_->is_array()) throw error("must be a list, got " + shown());
}

JsonField JsonField::at(const std::string& key) const {
  if (std::optional<JsonField> f = find(key)) return *f;
  throw child(*value_, key).error("missing (a required field)");
}

std::optional<JsonField> JsonField::find(const std::string& key) const {
  require_object();
  const auto it = value_->find(key);
  if (it == value_->end() || it->is_null()) return std::nullopt;
  return child(*it, key);
}

std::vector<std::pair<std::string, JsonField>> JsonField::members() const {
  require_object();
  std::vector<std::pair<std::string, JsonField>> out;
  out.reserve(value_->size());
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    out.emplace_back(it.key(), child(*it, it.key()));
  }
  return out;
}

std::vector<JsonField> JsonField::elements() const {
  require_array();
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (std::size_t i = 0; i < value_->size(); ++i) {
    out.push_back(JsonField((*value_)[i], file_, field_ + "[" + std::to_string(i) + "]"));
  }
  return out;
}

std::int64_t JsonField::integer(std::int64_t min, std::int64_t max) const {
  // JSON integers arrive as int64 or, when positive, as uint64; a fraction or an exponent makes
  // a float, which is refused rather than rounded.
  bool in_range = false;
  std::int64_t value = 0;
  if (value_->is_number_unsigned()) {
    const auto u = value_->get<std::uint64_t>();
    in_range = u <= static_cast<std::uint64_t>(INT64_MAX) && static_cast<std::int64_t>(u) >= min &&
               static_cast<std::int64_t>(u) <= max;
    value = in_range ? static_cast<std::int64_t>(u) : 0;
  } else if (value_->is_number_integer()) {
    value = value_->get<std::int64_t>();
    in_range = value >= min && value <= max;
  }
  if (!in_range) {
    throw error("must be an integer from " + std::to_string(min) + " to " + std::to_string(max) +
                ", got " + shown());
  }
  return value;
}

double JsonField::real() const {
  if (!value_->is_number() || !std::isfinite(value_->get<double>())) {
    throw error("must be a finite number, got " + shown());
  }
  return value_->get<double>();
}

bool JsonField::boolean() const {
  if (!value_->is_boolean()) throw error("must be true or false, got " + shown());
  return value_->get<bool>();
}

const std::string& JsonField::text() const {
  if (!value_->is_string()) throw error("must be a string, got " + shown());
  return value_->get_ref<const std::string&>();
}

std::int64_t JsonField::integer_or(const std::string& key, std::int64_t fallback, std::int64_t min,
                                   std::int64_t max) const {
  const std::optional<JsonField> f = find(key);
  return f ? f->integer(min, max) : fallback;
}

double JsonField::real_or(const std::string& key, double fallback) const {
  const std::optional<JsonField> f = find(key);
  return f ? f->real() : fallback;
}

bool JsonField::boolean_or(const std::string& key, bool fallback) const {
  const std::optional<JsonField> f = find(key);
  return f ? f->boolean() : fallback;
}

std::string JsonField::text_or(const std::string& key, const std::string& fallback) const {
  const std::optional<JsonField> f = find(key);
  return f ? f->text() : fallback;
}

JsonField parse_json_object(std::string_view text, const std::string& file, Json& holder) {
  holder = parse_json(text, file);
  JsonField root(holder, file);
  root.require_object();
  return root;
}

}  // namespace kvo::model
