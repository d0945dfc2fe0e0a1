// The fingerprint every saved context's writer uses (kvoffload/fingerprint.hpp): one canonical
// text per number, sorted fields, the first difference named with both values, and digests that
// do not depend on how the bytes were fed or on how many threads hashed them.
#include "kvoffload/fingerprint.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"

namespace kvo {
namespace {

// Python's repr of each value (the drop-in's config values are Python floats): the canonical text
// of a non-integral number is laid out the same way.
TEST(FingerprintNumber, NonIntegralNumbersReadAsPythonsReprWritesThem) {
  const struct {
    double value;
    const char* text;
  } cases[] = {{1e-05, "1e-05"},
               {1e-06, "1e-06"},
               {0.0001, "0.0001"},
               {0.00012345, "0.00012345"},
               {1.5e16, "1.5e+16"},
               {1e16, "1e+16"},
               {123.456, "123.456"},
               {0.1, "0.1"},
               {-2.5, "-2.5"},
               {1.0000004e-05, "1.0000004e-05"},
               {static_cast<double>(1e-5f), "9.999999747378752e-06"},
               {1e300, "1e+300"},
               {5e-324, "5e-324"},
               {1.7976931348623157e308, "1.7976931348623157e+308"},
               {123456789012345.6, "123456789012345.6"},
               {9007199254740992.0, "9007199254740992.0"},
               {1000000000000000.5, "1000000000000000.5"},
               {3.14159, "3.14159"}};
  for (const auto& c : cases) EXPECT_EQ(fingerprint_number(c.value), c.text) << c.value;
}

TEST(FingerprintNumber, IntegralNumbersAreIntegers) {
  EXPECT_EQ(fingerprint_number(500000.0), "500000");
  EXPECT_EQ(fingerprint_number(0.0), "0");
  EXPECT_EQ(fingerprint_number(-0.0), "0");
  EXPECT_EQ(fingerprint_number(-3.0), "-3");
  EXPECT_EQ(fingerprint_number(9007199254740991.0), "9007199254740991");
  // 1000000 and 1000001 (a rope base) differ; so do eps 1e-5 and 1.0000004e-5.
  EXPECT_NE(fingerprint_number(1000000.0), fingerprint_number(1000001.0));
  EXPECT_NE(fingerprint_number(1e-5), fingerprint_number(1.0000004e-5));
}

TEST(FingerprintNumber, EveryDoubleReadsBackExactly) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, sizeof value);
    if (!std::isfinite(value)) continue;
    const std::string text = fingerprint_number(value);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), value) << text;
  }
}

TEST(FingerprintNumber, NonFiniteNumbersAreRefused) {
  testing::expect_error([&] { fingerprint_number(std::nan("")); }, ErrorCode::kInvalidArgument,
                        "NaN");
  testing::expect_error([&] { fingerprint_number(INFINITY); }, ErrorCode::kInvalidArgument, "inf");
  Fingerprint f;
  testing::expect_error(
      [&] { f.set_number("config.rms_norm_eps", -INFINITY); }, ErrorCode::kInvalidArgument,
      "config.rms_norm_eps: a model fingerprint holds finite numbers only, got -inf");
}

TEST(Fingerprint, FieldsAreSortedAndEscaped) {
  Fingerprint f;
  f.set("weights.xxh3", "ab");
  f.set_number("config.rms_norm_eps", 1e-5);
  f.set_bool("config.tie_word_embeddings", true);
  f.set("config.name", "two\nlines \\ here");
  EXPECT_EQ(
      f.text(),
      "kvoffload-fingerprint 2\nconfig.name=two\\nlines \\\\ here\nconfig.rms_norm_eps=1e-05\n"
      "config.tie_word_embeddings=true\nweights.xxh3=ab");
  EXPECT_TRUE(is_fingerprint(f.text()));
  EXPECT_FALSE(is_fingerprint("architecture=LlamaForCausalLM\nlayers=2"));
  EXPECT_FALSE(is_fingerprint("kvoffload-fingerprint 20\nx=1"));
  EXPECT_EQ(fingerprint_field(f.text(), "config.rms_norm_eps"), "1e-05");
  EXPECT_EQ(fingerprint_field(f.text(), "config.absent"), "");
  testing::expect_error([&] { f.set("a=b", "1"); }, ErrorCode::kInvalidArgument, "holds '='");
  testing::expect_error([&] { f.set("a b", "1"); }, ErrorCode::kInvalidArgument, "a space");
  testing::expect_error([&] { f.set("", "1"); }, ErrorCode::kInvalidArgument, "empty");
}

TEST(Fingerprint, TheFirstDifferenceIsNamedWithBothValues) {
  Fingerprint a;
  a.set_number("config.rope_parameters.rope_theta", 10000);
  a.set_number("config.rms_norm_eps", 1e-5);
  a.set("weights.xxh3", "00ff");
  Fingerprint b = a;
  EXPECT_EQ(fingerprint_difference(a.text(), b.text()), "");
  b.set_number("config.rope_parameters.rope_theta", 500000);
  b.set("weights.xxh3", "11ee");
  EXPECT_EQ(fingerprint_difference(a.text(), b.text()),
            "config.rope_parameters.rope_theta is 10000 in the file and 500000 here");
  Fingerprint c = a;
  c.set("load.activations", "q8");
  EXPECT_EQ(fingerprint_difference(a.text(), c.text()),
            "load.activations is absent in the file and q8 here");
  EXPECT_EQ(fingerprint_difference(c.text(), a.text()),
            "load.activations is q8 in the file and absent here");
  // A file may hold any bytes: they are shown escaped and cut.
  const std::string hostile = a.text() + "\nconfig.zz=\x1b[2J" + std::string(500, 'x');
  const std::string shown = fingerprint_difference(hostile, a.text());
  EXPECT_NE(shown.find("config.zz is \\x1b[2J"), std::string::npos) << shown;
  EXPECT_LT(shown.size(), 300u);
}

std::vector<unsigned char> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(n);
  for (unsigned char& b : out) b = static_cast<unsigned char>(rng());
  return out;
}

TEST(WeightsDigest, TheBytesDigestIsTheSameHoweverTheyAreFed) {
  // Past two 64 MiB blocks, so that the blocks are hashed on several threads.
  const std::vector<unsigned char> bytes = random_bytes((128u << 20) + 4099, 1);
  const std::string one = WeightsDigest::bytes_digest(bytes.data(), bytes.size(), 1);
  EXPECT_EQ(one.size(), 32u);
  EXPECT_EQ(WeightsDigest::bytes_digest(bytes.data(), bytes.size(), 3), one);
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 3; ++trial) {
    WeightsDigest::TensorBytes pieces;
    std::size_t at = 0;
    while (at < bytes.size()) {
      const std::size_t n = std::min<std::size_t>(bytes.size() - at, rng() % (40u << 20) + 1);
      pieces.update(bytes.data() + at, n);
      at += n;
    }
    EXPECT_EQ(pieces.digest(), one);
  }
  const std::vector<std::string> many = WeightsDigest::bytes_digests(
      {{bytes.data(), 100}, {bytes.data(), bytes.size()}, {nullptr, 0}}, 2);
  EXPECT_EQ(many[0], WeightsDigest::bytes_digest(bytes.data(), 100, 1));
  EXPECT_EQ(many[1], one);
  EXPECT_EQ(many[2], WeightsDigest::bytes_digest(nullptr, 0, 1));
  // One bit anywhere, a byte more or less: another digest.
  std::vector<unsigned char> flipped = bytes;
  flipped[(64u << 20) + 17] ^= 4;
  EXPECT_NE(WeightsDigest::bytes_digest(flipped.data(), flipped.size()), one);
  EXPECT_NE(WeightsDigest::bytes_digest(bytes.data(), bytes.size() - 1), one);
}

TEST(WeightsDigest, EveryNameDtypeShapeAndByteCountsInAnyOrder) {
  const std::vector<unsigned char> a = random_bytes(256, 3);
  const std::vector<unsigned char> b = random_bytes(64, 4);
  const auto digest = [&](bool reversed, const std::string& dtype,
                          std::vector<std::int64_t> shape_a, const std::string& name_b) {
    WeightsDigest d;
    if (reversed) d.add(name_b, "F32", {16}, b.data(), b.size());
    d.add("model.embed_tokens.weight", dtype, shape_a, a.data(), a.size());
    if (!reversed) d.add(name_b, "F32", {16}, b.data(), b.size());
    return d.hex();
  };
  const std::string base = digest(false, "F32", {8, 8}, "model.norm.weight");
  EXPECT_EQ(digest(true, "F32", {8, 8}, "model.norm.weight"), base);
  EXPECT_NE(digest(false, "BF16", {8, 8}, "model.norm.weight"), base);
  EXPECT_NE(digest(false, "F32", {4, 16}, "model.norm.weight"), base);
  EXPECT_NE(digest(false, "F32", {8, 8}, "model.norm.bias"), base);
  WeightsDigest same;
  same.add_digest("model.embed_tokens.weight", "F32", {8, 8},
                  WeightsDigest::bytes_digest(a.data(), a.size()));
  same.add("model.norm.weight", "F32", {16}, b.data(), b.size());
  EXPECT_EQ(same.hex(), base);
  testing::expect_error([&] { same.add("model.norm.weight", "F32", {16}, b.data(), b.size()); },
                        ErrorCode::kInvalidArgument, "has a tensor model.norm.weight already");
}

TEST(FilesDigest, EachFileCountsAndAbsentOnesToo) {
  const std::string dir = ::testing::TempDir() + "kvo_files_digest_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  const std::vector<std::string> names = {"tokenizer.json", "tokenizer_config.json"};
  EXPECT_EQ(files_digest(dir, names), "");
  std::ofstream(dir + "/tokenizer.json") << "{}";
  const std::string json = files_digest(dir, names);
  std::ofstream(dir + "/tokenizer_config.json") << "{}";
  const std::string both = files_digest(dir, names);
  std::ofstream(dir + "/tokenizer.json") << "{ }";
  const std::string changed = files_digest(dir, names);
  EXPECT_EQ(json.size(), 32u);
  EXPECT_NE(json, both);
  EXPECT_NE(both, changed);
  // A name that is not a regular file is refused, naming it.
  ::unlink((dir + "/tokenizer.json").c_str());
  ::mkdir((dir + "/tokenizer.json").c_str(), 0755);
  testing::expect_error([&] { files_digest(dir, names); }, ErrorCode::kInvalidArgument,
                        "a directory");
}

}  // namespace
}  // namespace kvo
