#include "model/json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kvoffload/error.hpp"

namespace kvo::model {

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& what) : text_(text), what_(what) {}

  Json document() {
    Json value = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the end");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw Error(ErrorCode::kInvalidArgument,
                what_ + ": " + problem + " at offset " + std::to_string(pos_));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  Json parse_value(int depth) {
    if (depth > 64) fail("nesting too deep");
    skip_space();
    Json value;
    const char c = peek();
    if (c == '{') {
      value.kind_ = Json::Kind::kObject;
      ++pos_;
      skip_space();
      if (peek() == '}') {
        ++pos_;
        return value;
      }
      while (true) {
        skip_space();
        if (peek() != '"') fail("expected a string key");
        std::string key = parse_string();
        skip_space();
        expect(':');
        value.object_[key] = parse_value(depth + 1);
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind_ = Json::Kind::kArray;
      ++pos_;
      skip_space();
      if (peek() == ']') {
        ++pos_;
        return value;
      }
      while (true) {
        value.array_.push_back(parse_value(depth + 1));
        skip_space();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind_ = Json::Kind::kString;
      value.string_ = parse_string();
      return value;
    }
    if (literal("true")) {
      value.kind_ = Json::Kind::kBool;
      value.bool_ = true;
      return value;
    }
    if (literal("false")) {
      value.kind_ = Json::Kind::kBool;
      return value;
    }
    if (literal("null")) return value;
    // Python's json module writes these for non-finite floats.
    if (literal("NaN")) return number_value(NAN);
    if (literal("Infinity")) return number_value(INFINITY);
    if (literal("-Infinity")) return number_value(-INFINITY);
    if (c == '-' || (c >= '0' && c <= '9')) {
      const char* begin = text_.c_str() + pos_;
      char* end = nullptr;
      const double number = std::strtod(begin, &end);
      if (end == begin) fail("malformed number");
      pos_ += static_cast<std::size_t>(end - begin);
      return number_value(number);
    }
    if (pos_ >= text_.size()) fail("unexpected end of text");
    fail(std::string("unexpected character '") + c + "'");
  }

  static Json number_value(double number) {
    Json value;
    value.kind_ = Json::Kind::kNumber;
    value.number_ = number;
    return value;
  }

  unsigned hex4() {
    if (pos_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9')
        code |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f')
        code |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        code |= static_cast<unsigned>(h - 'A' + 10);
      else
        fail("bad \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xc0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xe0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (code & 0x3f));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xd800 && code < 0xdc00 && text_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            const unsigned low = hex4();
            code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  const std::string& text_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

Json Json::parse(const std::string& text, const std::string& what) {
  return JsonParser(text, what).document();
}

const Json* Json::find(const std::string& key) const {
  if (kind_ != Kind::kObject) return nullptr;
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &it->second;
}

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace kvo::model
