// JSON as the model files are read: RFC 8259 through nlohmann-json, and stricter where a
// repeated or ambiguous field could hide an error. No object may repeat a key (which of two
// "data_offsets" would be meant?), nesting stops at 64 levels, strings are UTF-8, and errors
// name the file, the line and the column, with any raw bytes escaped.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvo::model {

using Json = nlohmann::json;

inline constexpr int kMaxJsonDepth = 64;

// Throws kvo::Error(kInvalidArgument) "<what>: <problem>" for malformed text or a repeated key.
Json parse_json(std::string_view text, const std::string& what);

// The contents of `path`, which must be a regular file (symbolic links followed) of at most
// `max_bytes`. Throws kvo::Error(kInvalidArgument) naming the path otherwise.
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes);

}  // namespace kvo::model
