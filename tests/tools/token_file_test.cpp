// Token files read strictly: what is accepted, and the line, column and escaped text of what is
// not.
#include <gtest/gtest.h>

#include <string>

#include "tools/cli/cli.hpp"
#include "tools/cli/token_file.hpp"

namespace kvo::cli {
namespace {

using Prompts = std::vector<std::vector<std::int32_t>>;

TEST(TokenFile, SeparatorsLinesAndBlanks) {
  EXPECT_EQ(parse_token_ids("1 2 3\n", "f"), (Prompts{{1, 2, 3}}));
  EXPECT_EQ(parse_token_ids("1,2,3", "f"), (Prompts{{1, 2, 3}}));
  EXPECT_EQ(parse_token_ids("  1, 2 ,3\t4  \r\n\n  \n5\r\n", "f"), (Prompts{{1, 2, 3, 4}, {5}}));
  EXPECT_EQ(parse_token_ids("0 2147483647", "f"), (Prompts{{0, 2147483647}}));
}

void expect_refused(const std::string& text, const std::string& needle) {
  try {
    parse_token_ids(text, "ids.txt");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    for (const char c : m) {
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unprintable byte in: " << m;
    }
  }
}

TEST(TokenFile, MalformedIdsAreRefusedWhereTheyAre) {
  expect_refused("1,2,,3", "ids.txt:1:5: an empty id between two commas");
  expect_refused("1 2\n3, ,4", "ids.txt:2:4: an empty id between two commas");
  expect_refused("1,2,", "ids.txt:1:5: a comma ends the line");
  expect_refused(",1", "ids.txt:1:1: a comma before the first id");
  expect_refused("1 -2", "ids.txt:1:3: '-' is not part of a token id");
  expect_refused("1 +2", "'+' is not part of a token id");
  expect_refused("1 2.5", "ids.txt:1:4: '.' is not part of a token id");
  expect_refused("12abc", "ids.txt:1:3: 'a' is not part of a token id");
  expect_refused("1 2147483648", "ids.txt:1:3: token id 2147483648 is larger than 2147483647");
  expect_refused("", "ids.txt holds no token ids");
  expect_refused("\n \n", "ids.txt holds no token ids");
}

TEST(TokenFile, BinaryBytesAreShownEscapedNeverEchoed) {
  // The start of a PNG and a terminal escape sequence.
  expect_refused(std::string("\x89PNG\r\n\x1a\n\0\0", 10), "ids.txt:1:1: '\\x89'");
  expect_refused("1 2 \x1b[2J", "ids.txt:1:5: '\\x1b'");
  expect_refused(std::string("5\0", 2), "'\\x00'");
}

}  // namespace
}  // namespace kvo::cli
