// safetensors read strictly to the format: every way a header can lie is refused when the file
// is opened, naming the tensor, and an index cannot reach outside its directory.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "expect_error.hpp"
#include "kvoffload/error.hpp"
#include "model/checkpoint/safetensors.hpp"

namespace kvo::model {
namespace {

using kvo::testing::expect_error;

// A whole file: the little-endian header length, the header, `data_bytes` zero bytes.
std::string file_bytes(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

std::map<std::string, TensorInfo> parse(const std::string& bytes) {
  return parse_safetensors(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(),
                           "t.safetensors");
}

void expect_refused(const std::string& header, std::size_t data_bytes, const std::string& needle) {
  expect_error([&] { parse(file_bytes(header, data_bytes)); }, ErrorCode::kInvalidArgument, needle);
}

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "kvo_safetensors_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(SafetensorsStrict, AWellFormedFileReads) {
  const auto t = parse(file_bytes(
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"I64","shape":[1],"data_offsets":[24,32]},)"
      R"("empty":{"dtype":"BF16","shape":[0,5],"data_offsets":[32,32]}})",
      32));
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("a").bytes, 24u);
  EXPECT_TRUE(t.at("a").dtype_supported);
  EXPECT_FALSE(t.at("b").dtype_supported);
  EXPECT_EQ(t.at("b").dtype_text, "I64");
  EXPECT_EQ((t.at("a").shape), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(t.at("empty").bytes, 0u);
}

TEST(SafetensorsStrict, OverlappingOffsetsAreRefused) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                 24, "tensors \"a\" and \"b\" overlap");
}

TEST(SafetensorsStrict, HolesAndTrailingBytesAreRefused) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                 20, "bytes 8 to 12 of the data section belong to no tensor");
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
                 "bytes 0 to 4 of the data section belong to no tensor");
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 16,
                 "the data section has 16 bytes but its tensors cover only 8");
}

TEST(SafetensorsStrict, ARepeatedNameIsRefused) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 8, "the key \"a\" appears twice");
  // Within an entry too: which data_offsets would be meant?
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"data_offsets":[0,4]}})",
                 4, "\"data_offsets\" appears twice");
}

TEST(SafetensorsStrict, OffsetsMustBeIntegers) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4195328.5]}})", 4,
                 "t.safetensors: a.data_offsets[1]: must be an integer from 0 to "
                 "9223372036854775807, got 4195328.5");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4e0]}})", 4,
                 "a.data_offsets[1]: must be an integer");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4,
                 "a.data_offsets[0]: must be an integer from 0 to 9223372036854775807, got -4");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", 4,
                 "a.data_offsets[0]: must be an integer");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4,
                 "a.data_offsets: must be two integers [begin, end], got [0,4,8]");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4,
                 "a.shape[0]: must be an integer from 0 to 9223372036854775807, got 1.0");
}

TEST(SafetensorsStrict, ShapeProductsNeverWrap) {
  // 2^40 x 2^40 elements: the element count alone passes 2^64.
  expect_refused(
      R"({"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}})", 4,
      "holds more than 2^64 bytes");
  // 65536 x (2^46 + 1) F32 is 2^64 + 2^18 bytes: it would wrap to 262144, a size that would
  // pass a check of the offsets.
  expect_refused(
      R"({"a":{"dtype":"F32","shape":[65536,70368744177665],"data_offsets":[0,262144]}})", 262144,
      "holds more than 2^64 bytes");
}

TEST(SafetensorsStrict, EntriesHoldExactlyTheirFields) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4,
                 "t.safetensors: a.extra: an unknown field");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1]}})", 4,
                 "t.safetensors: a.data_offsets: missing");
  expect_refused(R"({"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", 4,
                 "a.dtype: an unknown dtype \"F99\"");
  expect_refused(R"({"__metadata__":{"format":1}})", 0,
                 "t.safetensors: __metadata__.format: must be a string, got 1");
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4,
                 "t.safetensors: a.data_offsets: [0, 4) hold 4 bytes but shape [2] of F32 needs 8");
}

TEST(SafetensorsStrict, HeadersThatAreNotJsonObjectsAreRefused) {
  expect_refused("[1,2]", 0, "does not start with '{'");
  expect_refused("{\"a\":", 0, "parse error");
  // Raw bytes in a message are escaped, not echoed.
  expect_refused("{\"a\xff\":1}", 0, "\\xff");
  // A length past the format's limit.
  std::string huge(8, '\0');
  huge[4] = 0x10;  // 2^36
  expect_error([&] { parse(huge + std::string(16, ' ')); }, ErrorCode::kInvalidArgument,
               "more than the format's limit of 100000000");
}

TEST(SafetensorsStrict, OnlyRegularFilesAreOpened) {
  const std::string dir = temp_dir("directory");
  ::mkdir((dir + "/model.safetensors").c_str(), 0755);
  expect_error([&] { Checkpoint c(dir); }, ErrorCode::kInvalidArgument,
               "model.safetensors is a directory, not a regular file");
  expect_error([&] { Checkpoint c(dir + "/model.safetensors/nothing"); },
               ErrorCode::kInvalidArgument, "cannot open the model directory");
  write_file(dir + "/file", "x");
  expect_error([&] { Checkpoint c(dir + "/file"); }, ErrorCode::kInvalidArgument,
               "is not a directory");
}

TEST(SafetensorsStrict, IndexPathsStayInTheModelDirectory) {
  for (const char* shard : {"../../../../other/model.safetensors", "/etc/passwd", "..", ".",
                            "sub/model.safetensors", "a\\\\b", ""}) {
    const std::string index =
        std::string(R"({"weight_map":{"model.norm.weight":")") + shard + "\"}}";
    expect_error([&] { parse_safetensors_index(index, "index.json"); }, ErrorCode::kInvalidArgument,
                 "not a file in the model directory");
  }
  // Every field named where it is: FILE: FIELD: what is wrong.
  expect_error(
      [&] {
        parse_safetensors_index(R"({"weight_map":{"model.norm.weight":"/etc/x"}})", "index.json");
      },
      ErrorCode::kInvalidArgument,
      "index.json: weight_map[\"model.norm.weight\"]: names \"/etc/x\", which is not");
  expect_error([&] { parse_safetensors_index(R"({"metadata":{}})", "index.json"); },
               ErrorCode::kInvalidArgument, "index.json: weight_map: missing");
  expect_error([&] { parse_safetensors_index(R"({"weight_map":{"a":3}})", "index.json"); },
               ErrorCode::kInvalidArgument, "index.json: weight_map.a: must be a string, got 3");
  expect_error([&] { parse_safetensors_index(R"({"weight_map":[]})", "index.json"); },
               ErrorCode::kInvalidArgument,
               "index.json: weight_map: must be a JSON object, got []");
  // Through the Checkpoint: refused before any file outside is opened.
  const std::string dir = temp_dir("escape");
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map":{"x":"../../../../other/model.safetensors"}})");
  expect_error([&] { Checkpoint c(dir); }, ErrorCode::kInvalidArgument,
               "not a file in the model directory");
  // A plain shard name reads.
  const ShardIndex ok = parse_safetensors_index(
      R"({"metadata":{"total_size":8},"weight_map":{"a":"one.safetensors","b":"two.safetensors",)"
      R"("c":"one.safetensors"}})",
      "index.json");
  EXPECT_EQ(ok.shards, (std::vector<std::string>{"one.safetensors", "two.safetensors"}));
  expect_error(
      [&] {
        parse_safetensors_index(R"({"weight_map":{"a":"x.safetensors","a":"y.safetensors"}})",
                                "index.json");
      },
      ErrorCode::kInvalidArgument, "the key \"a\" appears twice");
}

TEST(SafetensorsStrict, IndexAndShardsMustAgree) {
  const std::string dir = temp_dir("agree");
  std::vector<TensorToWrite> one = {{"a", DType::kF32, {1}, std::vector<std::byte>(4)}};
  std::vector<TensorToWrite> two = {{"b", DType::kF32, {1}, std::vector<std::byte>(4)},
                                    {"a", DType::kF32, {1}, std::vector<std::byte>(4)}};
  write_safetensors(dir + "/one.safetensors", one);
  write_safetensors(dir + "/two.safetensors", two);
  // "a" is in both shards.
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map":{"a":"one.safetensors","b":"two.safetensors"}})");
  expect_error([&] { Checkpoint c(dir); }, ErrorCode::kInvalidArgument, "tensor \"a\" is in both");
  // The index places a tensor in a shard that lacks it.
  write_safetensors(dir + "/two.safetensors", {two[0]});
  write_file(
      dir + "/model.safetensors.index.json",
      R"({"weight_map":{"a":"two.safetensors","b":"two.safetensors","c":"one.safetensors"}})");
  expect_error([&] { Checkpoint c(dir); }, ErrorCode::kInvalidArgument,
               "places tensor \"a\" in two.safetensors, which does not hold it");
}

TEST(SafetensorsStrict, WhatTheWriterWritesReadsBack) {
  const std::string dir = temp_dir("writer");
  std::vector<TensorHeader> headers = {{"x", DType::kBF16, {3, 5}}, {"y", DType::kF32, {7}}};
  SafetensorsWriter writer(dir + "/model.safetensors", headers);
  std::vector<std::byte> bytes(30 + 28);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i);
  writer.write(bytes.data(), 17);  // in pieces that cross tensors
  writer.write(bytes.data() + 17, bytes.size() - 17);
  writer.finish();
  SafetensorsFile f(dir + "/model.safetensors");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors().at("y").bytes, 28u);
  EXPECT_EQ(std::memcmp(f.tensors().at("y").data, bytes.data() + 30, 28), 0);
  // Too few bytes is an error at finish, too many at write.
  SafetensorsWriter short_writer(dir + "/short.safetensors", headers);
  short_writer.write(bytes.data(), 10);
  EXPECT_THROW(short_writer.finish(), Error);
  SafetensorsWriter long_writer(dir + "/long.safetensors", headers);
  std::vector<std::byte> more(100);
  EXPECT_THROW(long_writer.write(more.data(), more.size()), Error);
}

}  // namespace
}  // namespace kvo::model
