// Text from files and command lines, made safe to print in an error message: bytes outside
// printable ASCII become \xNN, and a long text is cut with "...", so a binary file or a stray
// escape sequence never reaches the terminal as it is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvo {

inline std::string printable(std::string_view text, std::size_t max_chars = 64) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_chars) return out + "...";
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace kvo
