// A small JSON reader for config.json, safetensors headers and index files: enough of RFC 8259
// for those (objects, arrays, strings with escapes, numbers, true/false/null), with errors that
// say where the text stops making sense.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kvo::model {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Parses `text`; throws kvo::Error(kInvalidArgument) "<what>: <problem> at offset N".
  static Json parse(const std::string& text, const std::string& what);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_array() const { return kind_ == Kind::kArray; }

  bool boolean() const { return bool_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  const std::vector<Json>& array() const { return array_; }
  const std::map<std::string, Json>& object() const { return object_; }
  // nullptr when this is not an object or has no such key.
  const Json* find(const std::string& key) const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> array_;
  std::map<std::string, Json> object_;
};

// Writes `text` as a JSON string literal, quotes included.
std::string json_quote(const std::string& text);

}  // namespace kvo::model
