// Files of token ids (kvo-generate --prompt-tokens): one prompt per line, ids separated by
// spaces, tabs or one comma ("1 2 3", "1,2,3", "1, 2, 3"); blank lines are skipped. Read strictly:
// an empty id ("1,,3"), a leading or trailing comma, a sign, or any other character is refused
// with its line and column, and bytes that are not printable are shown escaped, never echoed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvo::cli {

// The most ids one file may hold in all, and so its largest size: eleven bytes per id at most
// ("2147483647,"), 11 GiB.
inline constexpr std::int64_t kMaxTokenFileIds = std::int64_t{1} << 30;
inline constexpr std::uint64_t kMaxTokenFileBytes =
    11 * static_cast<std::uint64_t>(kMaxTokenFileIds);

// [prompts][ids]. Throws UsageError "<source>:<line>:<column>: <problem>".
std::vector<std::vector<std::int32_t>> parse_token_ids(std::string_view text,
                                                       const std::string& source);

// Reads `path` (a regular file of at most kMaxTokenFileBytes, opened once without blocking) and
// parses it. Throws UsageError naming the path.
std::vector<std::vector<std::int32_t>> read_token_file(const std::string& path);

}  // namespace kvo::cli
