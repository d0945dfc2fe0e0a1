// The tokenizer loaders on hostile files: every id checked to be an integer the model can embed,
// every field of the wrong type named with its file and place, NUL bytes and long runs carried
// through, and a regex that cannot finish refused rather than cut short. A small byte-level BPE
// is built here as tokenizer.json is written; each case changes one part of it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "expect_error.hpp"
#include "kvoffload/error.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {
namespace {

using kvo::testing::expect_error;
using Json = nlohmann::json;

// GPT-2's byte-to-character map, as the BPE's vocabulary writes its byte tokens.
std::string byte_char(int b) {
  int next = 256;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
    const int cp = printable ? x : next++;
    if (x == b) {
      std::string out;
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
      } else {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
      }
      return out;
    }
  }
  return {};
}

// Every byte a token (ids 0-255), three merges ("he", "ll", "hell": 256-258), one special
// token (<|end|>, 259), ByteLevel pre-tokenizer and decoder, a BOS-like prefix from the
// post-processor.
Json tokenizer_json() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  Json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"h e", "l l", "he ll"}}};
  j["added_tokens"] = {{{"id", 259}, {"content", "<|end|>"}, {"special", true}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|end|>", {{"id", "<|end|>"}, {"ids", {259}}, {"tokens", {"<|end|>"}}}}}}};
  return j;
}

std::unique_ptr<Tokenizer> parse(const Json& j) {
  return parse_bpe_tokenizer(j.dump(), TokenizerSettings{}, "tokenizer.json");
}

void expect_refused(const Json& j, const std::string& needle) {
  expect_error([&] { parse(j); }, ErrorCode::kInvalidArgument, needle);
}

TEST(Tokenizer, TheSmallBpeRoundTripsRandomText) {
  const auto t = parse(tokenizer_json());
  EXPECT_EQ(t->vocab_size(), 260);
  EXPECT_EQ(t->encode("hello", false), (std::vector<std::int32_t>{258, 'o'}));
  EXPECT_EQ(t->encode("hello", true), (std::vector<std::int32_t>{259, 258, 'o'}));
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text.push_back(static_cast<char>(rng() % 128));  // ASCII, NULs too
    const auto ids = t->encode(text, false);
    for (const std::int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t->vocab_size());
    EXPECT_EQ(t->decode(ids, false), text);
  }
}

TEST(Tokenizer, IdsMustBeIntegersTheModelCanEmbed) {
  for (const auto& [value, shown] :
       std::vector<std::pair<Json, std::string>>{{Json(-3), "-3"},
                                                 {Json(std::int64_t{1} << 40), "1099511627776"},
                                                 {Json(3.7), "3.7"},
                                                 {Json("5"), "\"5\""},
                                                 {Json(4194304), "4194304"}}) {
    Json j = tokenizer_json();
    j["model"]["vocab"]["he"] = value;
    expect_refused(
        j, "tokenizer.json: model.vocab.he: must be an integer from 0 to 4194303, got " + shown);
    j = tokenizer_json();
    j["added_tokens"][0]["id"] = value;
    expect_refused(j,
                   "tokenizer.json: added_tokens[0].id: must be an integer from 0 to 4194303, "
                   "got " +
                       shown);
  }
}

TEST(Tokenizer, AnEmptyVocabularyAndMissingPartsAreRefused) {
  Json j = tokenizer_json();
  j["model"]["vocab"] = Json::object();
  j["model"]["merges"] = Json::array();
  expect_refused(j, "tokenizer.json: model.vocab: is empty");
  j = tokenizer_json();
  j["model"].erase("vocab");
  expect_refused(j, "tokenizer.json: model.vocab: missing");
  j = tokenizer_json();
  j["model"]["merges"] = Json::array({Json::array({"h"})});
  expect_refused(j, "tokenizer.json: model.merges[0]: a merge must be two tokens");
  j = tokenizer_json();
  j["added_tokens"][0]["content"] = 7;
  expect_refused(j, "tokenizer.json: added_tokens[0].content: must be a string, got 7");
  expect_error([] { parse_bpe_tokenizer("[1, 2]", TokenizerSettings{}, "tokenizer.json"); },
               ErrorCode::kInvalidArgument,
               "tokenizer.json: (the document): must be a JSON object");
}

// A vocabulary maps ids and tokens one to one, and has a token of its own for every byte its
// tokens spell (else a text holding that byte elsewhere would lose it).
TEST(Tokenizer, AVocabularyIsABijectionReachingEveryByteItSpells) {
  Json j = tokenizer_json();
  j["model"]["vocab"]["ll"] = 256;  // the id of "he"
  expect_refused(j, "tokenizer.json: model.vocab: gives id 256 to two tokens, 'he' and 'll'");
  j = tokenizer_json();
  j["model"]["vocab"].erase(byte_char('l'));  // "ll" and "hell" still spell it
  j["model"]["vocab"]["<l>"] = 'l';
  expect_refused(j, "has tokens spelling byte 0x6c ('l') but no token of that byte alone");
  // A byte no token spells may lack its token (SmolLM2's vocabulary lacks 21 such bytes).
  j = tokenizer_json();
  j["model"]["vocab"].erase(byte_char(0xff));
  EXPECT_EQ(parse(j)->encode("hello", false), (std::vector<std::int32_t>{258, 'o'}));
}

// SmolLM2's ChatML template with a default system message that holds escapes: rendered as Jinja
// (and so transformers) renders them, not copied as written. The expected text is jinja2's
// rendering of this template for one user message "hi".
TEST(ChatFormat, TheDefaultSystemMessageIsRenderedAsJinjaRendersIt) {
  const std::string before =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] "
      "!= 'system' %}{{ '<|im_start|>system\n";
  const std::string after =
      "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  TokenizerSettings s;
  s.chat_template = before + R"(You are\nhelpful\t\x41\u00e9 \\ it\'s)" + after;
  const ChatFormat chat = chat_format(s, std::nullopt);
  EXPECT_EQ(chat.before + "hi" + chat.after,
            "<|im_start|>system\nYou are\nhelpful\tA\xc3\xa9 \\ it's<|im_end|>\n<|im_start|>user\n"
            "hi<|im_end|>\n<|im_start|>assistant\n");
  // A system message given replaces it as it is.
  EXPECT_EQ(chat_format(s, std::string("be\\n brief")).before,
            "<|im_start|>system\nbe\\n brief<|im_end|>\n<|im_start|>user\n");
  // What is not one literal, or an escape not rendered here, is refused, never guessed.
  for (const char* body : {"it's", "a \\q b", "\\x4", "\\ud800"}) {
    s.chat_template = before + body + after;
    expect_error([&] { chat_format(s, std::nullopt); }, ErrorCode::kInvalidArgument,
                 "is not one kvo-generate can build faithfully");
  }
}

// A conversation (kvo-serve's messages) renders as the template does: one user message as before +
// message + after; the default system message only where the conversation opens without one; a
// plain ChatML template writes none. The expected texts are jinja2's renderings of the templates.
TEST(ChatFormat, AConversationRendersAsTheTemplateDoes) {
  TokenizerSettings s;
  s.chat_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
      "'<|im_start|>system\nBe kind.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
      "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if "
      "add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  const ChatFormat smol = chat_format(s, std::nullopt);
  EXPECT_EQ(chat_text(smol, {{"user", "hi"}}), smol.before + "hi" + smol.after);
  EXPECT_EQ(chat_text(smol, {{"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}}),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nbye<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat_text(smol, {{"system", "Be brief."}, {"user", "hi"}}),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  s.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|im_start|>assistant\n' }}{% endif %}";
  const ChatFormat plain = chat_format(s, std::nullopt);
  EXPECT_FALSE(plain.default_system.has_value());
  EXPECT_EQ(chat_text(plain, {{"user", "hi"}}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  expect_error([&] { chat_text(plain, {}); }, ErrorCode::kInvalidArgument, "needs a message");
  expect_error(
      [&] {
        chat_text(plain, {{"user", "hi"}, {"tool", "x"}});
      },
      ErrorCode::kInvalidArgument, "not 'tool'");
}

TEST(Tokenizer, PostProcessorIdsMustBeTheTokenizersOwn) {
  for (const Json& id : {Json(-7), Json(99999999), Json(300), Json(2.5)}) {
    Json j = tokenizer_json();
    j["post_processor"]["special_tokens"]["<|end|>"]["ids"] = Json::array({id});
    expect_refused(j, "post_processor.special_tokens[\"<|end|>\"].ids[0]: ");
  }
  Json j = tokenizer_json();
  j["post_processor"]["special_tokens"]["<|end|>"]["ids"] = Json::array({300});
  expect_refused(j, "token id 300 is not in the tokenizer's vocabulary or added tokens");
}

TEST(Tokenizer, TextAfterANulByteIsNormalizedToo) {
  Json j = tokenizer_json();
  j["normalizer"] = {{"type", "NFC"}};
  const auto t = parse(j);
  // "e" + U+0301 (combining acute) composes to U+00E9 under NFC, after the NUL too.
  const std::string text = std::string("a\0b", 3) + "e\xcc\x81" + std::string("\0c", 2);
  const std::string nfc = std::string("a\0b", 3) + "\xc3\xa9" + std::string("\0c", 2);
  EXPECT_EQ(t->decode(t->encode(text, false), false), nfc);
}

TEST(Tokenizer, ARegexThatCannotFinishIsAnErrorNotAShortSplit) {
  Json j = tokenizer_json();
  // Catastrophic backtracking: PCRE2's match limit stops it.
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}};
  const auto t = parse(j);
  expect_error([&] { t->encode(std::string(60, 'a') + "b", false); }, ErrorCode::kInvalidArgument,
               "failed on the text");
  // A long run of one class (here a million spaces) is split, not refused.
  const std::string spaces(1 << 20, ' ');
  const auto gpt2 = parse(tokenizer_json());
  EXPECT_EQ(gpt2->decode(gpt2->encode(spaces, false), false), spaces);
}

TEST(Tokenizer, IdsPastTheVocabularyDecodeToNothing) {
  const auto t = parse(tokenizer_json());
  EXPECT_EQ(t->token_bytes(5000, false), "");
  EXPECT_EQ(t->decode({'a', 5000, 'b'}, false), "ab");
  expect_error([&] { t->token_bytes(-1, false); }, ErrorCode::kInvalidArgument, "negative");
  check_tokenizer_fits(*t, 260, "model");
  expect_error([&] { check_tokenizer_fits(*t, 259, "model"); }, ErrorCode::kInvalidArgument,
               "has ids up to 259 but config.json's vocab_size is 259");
}

TEST(TokenizerSettings, FieldsOfTheWrongTypeAreNamed) {
  expect_error([] { parse_tokenizer_settings(R"({"eos_token": 5})", "tc.json"); },
               ErrorCode::kInvalidArgument, "tc.json: eos_token: must be a token");
  expect_error([] { parse_tokenizer_settings(R"({"add_bos_token": "yes"})", "tc.json"); },
               ErrorCode::kInvalidArgument, "tc.json: add_bos_token: must be true or false");
  expect_error([] { parse_tokenizer_settings(R"({"bos_token": {"content": 1}})", "tc.json"); },
               ErrorCode::kInvalidArgument, "tc.json: bos_token.content: must be a string");
  const TokenizerSettings s = parse_tokenizer_settings(
      R"({"eos_token": {"content": "<|end|>"}, "add_bos_token": false, "chat_template": "x"})",
      "tc.json");
  EXPECT_EQ(s.eos_token, "<|end|>");
  EXPECT_EQ(s.add_bos_token, false);
  EXPECT_EQ(s.chat_template, "x");
  EXPECT_EQ(parse_bpe_tokenizer(tokenizer_json().dump(), s, "tokenizer.json")->eos_id(), 259);
  // An eos_token the vocabulary lacks is refused by the tokenizer that reads the settings.
  TokenizerSettings missing = s;
  missing.eos_token = "<|nope|>";
  expect_error([&] { parse_bpe_tokenizer(tokenizer_json().dump(), missing, "tokenizer.json"); },
               ErrorCode::kInvalidArgument, "'<|nope|>' is not in the vocabulary");
}

TEST(GenerationConfig, EosIdsAreCheckedIntegers) {
  EXPECT_EQ(parse_generation_eos(R"({"eos_token_id": 2})", "g.json"), std::vector<std::int32_t>{2});
  EXPECT_EQ(parse_generation_eos(R"({"eos_token_id": [2, 7]})", "g.json"),
            (std::vector<std::int32_t>{2, 7}));
  EXPECT_TRUE(parse_generation_eos(R"({"eos_token_id": null})", "g.json").empty());
  expect_error([] { parse_generation_eos(R"({"eos_token_id": 3.7})", "g.json"); },
               ErrorCode::kInvalidArgument, "g.json: eos_token_id: must be an integer");
  expect_error([] { parse_generation_eos(R"({"eos_token_id": [1, -2]})", "g.json"); },
               ErrorCode::kInvalidArgument, "g.json: eos_token_id[1]: must be an integer");
  expect_error([] { parse_generation_eos(R"({"eos_token_id": 1099511627776})", "g.json"); },
               ErrorCode::kInvalidArgument, "got 1099511627776");
}

TEST(Tokenizer, AFifoInThePlaceOfAFileIsRefusedWithoutBlocking) {
  const std::string dir = ::testing::TempDir() + "kvo_tokenizer_fifo";
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/tokenizer.json";
  std::remove(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  expect_error([&] { load_tokenizer(dir); }, ErrorCode::kInvalidArgument,
               "tokenizer.json is a FIFO, not a regular file");
  std::remove(path.c_str());
  { std::ofstream(path) << tokenizer_json().dump(); }
  const std::string config = dir + "/tokenizer_config.json";
  ASSERT_EQ(::mkfifo(config.c_str(), 0644), 0);
  expect_error([&] { load_tokenizer(dir); }, ErrorCode::kInvalidArgument,
               "tokenizer_config.json is a FIFO, not a regular file");
  std::remove(config.c_str());
  EXPECT_EQ(load_tokenizer(dir)->vocab_size(), 260);
}

}  // namespace
}  // namespace kvo::model
