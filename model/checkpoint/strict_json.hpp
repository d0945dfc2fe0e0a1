// JSON as the model files are read: RFC 8259 through nlohmann-json, and stricter where a
// repeated or ambiguous field could hide an error. No object may repeat a key (which of two
// "data_offsets" would be meant?), nesting stops at 64 levels, strings are UTF-8, and errors
// name the file, the line and the column, with any raw bytes escaped.
//
// Fields are read through JsonField, so that every problem with every JSON file reads the same:
//   FILE: FIELD: what is wrong
//   .../tokenizer.json: model.vocab["hello"]: must be an integer from 0 to 4194303, got -3
// FIELD is the path from the document's root (members by name, array elements by [index]); a
// value is never converted to another type or range on the way (3.7 is not an integer, 2^40 is
// not an int32).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvoffload/error.hpp"

namespace kvo::model {

using Json = nlohmann::json;

inline constexpr int kMaxJsonDepth = 64;

// Throws kvo::Error(kInvalidArgument) "<what>: <problem>" for malformed text or a repeated key.
Json parse_json(std::string_view text, const std::string& what);

// The contents of `path`, which must be a regular file (symbolic links followed) of at most
// `max_bytes`, opened once without blocking (offload/util/input_file.hpp). Throws
// kvo::Error(kInvalidArgument) naming the path otherwise.
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes);

// A value inside a parsed JSON document, with the file and the field it came from. Cheap to copy
// (the document is not copied); the document must outlive it.
class JsonField {
 public:
  // The root of a document read from `file`.
  JsonField(const Json& root, const std::string& file);

  const Json& json() const { return *value_; }
  const std::string& file() const { return *file_; }
  // "model.vocab[\"hello\"]"; "(the document)" for the root.
  std::string field() const;
  bool is_null() const { return value_->is_null(); }

  // kvo::Error(kInvalidArgument) "FILE: FIELD: problem".
  Error error(const std::string& problem) const;
  // The value as JSON text, shortened and escaped for a message.
  std::string shown() const;

  // Members of an object (the value must be one). at(): required, and null counts as missing;
  // find(): nullopt when absent or null (transformers writes null for unset fields).
  JsonField at(const std::string& key) const;
  std::optional<JsonField> find(const std::string& key) const;
  // Each member / element, with its place. The value must be an object / an array.
  std::vector<std::pair<std::string, JsonField>> members() const;
  std::vector<JsonField> elements() const;

  // Typed reads; each throws error("must be ..., got <value>") when the value is not one.
  void require_object() const;
  void require_array() const;
  std::int64_t integer(std::int64_t min, std::int64_t max) const;  // no fraction, no exponent
  double real() const;                                             // finite
  bool boolean() const;
  const std::string& text() const;

  // The same for an optional member, with a default when it is absent or null.
  std::int64_t integer_or(const std::string& key, std::int64_t fallback, std::int64_t min,
                          std::int64_t max) const;
  double real_or(const std::string& key, double fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string text_or(const std::string& key, const std::string& fallback) const;

 private:
  JsonField(const Json& value, std::shared_ptr<const std::string> file, std::string field)
      : value_(&value), file_(std::move(file)), field_(std::move(field)) {}
  JsonField child(const Json& value, const std::string& key) const;

  const Json* value_;
  std::shared_ptr<const std::string> file_;
  std::string field_;
};

// parse_json(text, file) read as a JsonField at its root, which must be an object. The document
// lives in `holder`.
JsonField parse_json_object(std::string_view text, const std::string& file, Json& holder);

}  // namespace kvo::model
