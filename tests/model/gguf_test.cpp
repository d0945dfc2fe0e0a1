// GGUF read strictly: a small file built here byte by byte is read back exactly (every value
// type, arrays, tensors of block types at aligned offsets), and every way the bytes can lie is
// refused when the file is opened, naming the file and the field: every truncation, counts and
// lengths of 2^40 (refused before anything is allocated for them), offsets past the end or off
// the alignment, overlapping tensors, unknown types, nested arrays, repeats, other versions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/planner.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/gguf_weights.hpp"
#include "model/common/numerics.hpp"
#include "model/decoder/decoder.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_workspace.hpp"
#include "model/text/tokenizer.hpp"
#include "model_test_util.hpp"

namespace kvo::model {
namespace {

using kvo::testing::expect_error;

// Little-endian bytes of a GGUF file, written field by field.
class Writer {
 public:
  template <typename T>
  Writer& put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
    return *this;
  }
  Writer& str(const std::string& s) {
    put<std::uint64_t>(s.size());
    out_ += s;
    return *this;
  }
  Writer& key(const std::string& k, GgufValueType type) {
    str(k);
    return put<std::uint32_t>(static_cast<std::uint32_t>(type));
  }
  Writer& pad_to(std::size_t alignment) {
    while (out_.size() % alignment != 0) out_ += '\0';
    return *this;
  }
  Writer& zeros(std::size_t n) {
    out_.append(n, '\0');
    return *this;
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

struct Tensor {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type;
  std::uint64_t offset;
};

// A valid file: the header, `pairs` metadata pairs written by `metadata`, the tensors, padding
// to `alignment` and `data` bytes of tensor data.
std::string gguf(std::uint64_t pairs, const std::function<void(Writer&)>& metadata,
                 const std::vector<Tensor>& tensors, std::size_t data, std::size_t alignment = 32,
                 std::uint32_t version = 3) {
  Writer w;
  w.bytes() = "GGUF";
  w.put<std::uint32_t>(version).put<std::uint64_t>(tensors.size()).put<std::uint64_t>(pairs);
  metadata(w);
  for (const Tensor& t : tensors) {
    w.str(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (std::uint64_t d : t.dims) w.put<std::uint64_t>(d);
    w.put<std::uint32_t>(t.type).put<std::uint64_t>(t.offset);
  }
  w.pad_to(alignment).zeros(data);
  return w.bytes();
}

GgufContents parse(const std::string& bytes) {
  return parse_gguf(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), "m.gguf");
}

void refused(const std::string& bytes, const std::string& message) {
  expect_error([&] { parse(bytes); }, ErrorCode::kInvalidArgument, message);
}

void write_file(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// Every value type once, and the tensors of a Q4_K matrix and an F32 vector.
void all_types(Writer& w) {
  w.key("general.architecture", GgufValueType::kString).str("llama");
  w.key("u8", GgufValueType::kUint8).put<std::uint8_t>(200);
  w.key("i8", GgufValueType::kInt8).put<std::int8_t>(-100);
  w.key("u16", GgufValueType::kUint16).put<std::uint16_t>(60000);
  w.key("i16", GgufValueType::kInt16).put<std::int16_t>(-30000);
  w.key("u32", GgufValueType::kUint32).put<std::uint32_t>(4000000000u);
  w.key("i32", GgufValueType::kInt32).put<std::int32_t>(-2000000000);
  w.key("f32", GgufValueType::kFloat32).put<float>(0.25f);
  w.key("bool", GgufValueType::kBool).put<std::uint8_t>(1);
  w.key("u64", GgufValueType::kUint64).put<std::uint64_t>(std::uint64_t{1} << 63);
  w.key("i64", GgufValueType::kInt64).put<std::int64_t>(-(std::int64_t{1} << 40));
  w.key("f64", GgufValueType::kFloat64).put<double>(1e300);
  w.key("tokens", GgufValueType::kArray).put<std::uint32_t>(8).put<std::uint64_t>(3);
  w.str("<s>").str("").str("h\xc3\xa9");
  w.key("scores", GgufValueType::kArray).put<std::uint32_t>(6).put<std::uint64_t>(2);
  w.put<float>(-1.5f).put<float>(2.0f);
  w.key("types", GgufValueType::kArray).put<std::uint32_t>(5).put<std::uint64_t>(2);
  w.put<std::int32_t>(1).put<std::int32_t>(-3);
}
constexpr std::uint64_t kAllTypesPairs = 15;
const std::vector<Tensor> kTwoTensors = {{"blk.0.attn_q.weight", {256, 2}, 12, 0},
                                         {"output_norm.weight", {16}, 0, 288}};
constexpr std::size_t kTwoTensorsData = 288 + 64;

TEST(Gguf, ReadsEveryValueTypeAndTheTensorTable) {
  const std::string bytes = gguf(kAllTypesPairs, all_types, kTwoTensors, kTwoTensorsData);
  const GgufContents c = parse(bytes);
  EXPECT_EQ(c.version, 3u);
  EXPECT_EQ(c.alignment, 32u);
  EXPECT_EQ(c.metadata.size(), kAllTypesPairs);
  EXPECT_EQ(c.metadata.at("general.architecture").text, "llama");
  EXPECT_EQ(c.metadata.at("u8").integer, 200);
  EXPECT_EQ(c.metadata.at("i8").integer, -100);
  EXPECT_EQ(c.metadata.at("u16").integer, 60000);
  EXPECT_EQ(c.metadata.at("i16").integer, -30000);
  EXPECT_EQ(c.metadata.at("u32").unsigned_integer, 4000000000u);
  EXPECT_EQ(c.metadata.at("i32").integer, -2000000000);
  EXPECT_EQ(c.metadata.at("f32").floating, 0.25);
  EXPECT_EQ(c.metadata.at("bool").integer, 1);
  EXPECT_EQ(c.metadata.at("u64").unsigned_integer, std::uint64_t{1} << 63);
  EXPECT_EQ(c.metadata.at("i64").integer, -(std::int64_t{1} << 40));
  EXPECT_EQ(c.metadata.at("f64").floating, 1e300);
  EXPECT_EQ(c.metadata.at("tokens").strings, (std::vector<std::string>{"<s>", "", "h\xc3\xa9"}));
  EXPECT_EQ(c.metadata.at("scores").floats, (std::vector<double>{-1.5, 2.0}));
  EXPECT_EQ(c.metadata.at("types").integers, (std::vector<std::int64_t>{1, -3}));
  ASSERT_EQ(c.tensors.size(), 2u);
  const GgufTensor& q = c.tensors[0];
  EXPECT_EQ(q.name, "blk.0.attn_q.weight");
  EXPECT_STREQ(q.type->name, "Q4_K");
  EXPECT_EQ(q.dims, (std::vector<std::int64_t>{256, 2}));
  EXPECT_EQ(q.bytes, 2u * 144u);  // one Q4_K block a row
  EXPECT_EQ(c.data_offset % 32, 0u);
  EXPECT_EQ(q.data, reinterpret_cast<const std::byte*>(bytes.data()) + c.data_offset);
  EXPECT_EQ(c.tensors[1].bytes, 64u);
  EXPECT_EQ(c.tensors[1].data, q.data + 288);
  EXPECT_EQ(c.tensor_index.at("output_norm.weight"), 1u);
}

TEST(Gguf, EveryTruncationIsRefused) {
  const std::string bytes = gguf(kAllTypesPairs, all_types, kTwoTensors, kTwoTensorsData);
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    bool threw = false;
    try {
      parse_gguf(reinterpret_cast<const std::byte*>(bytes.data()), size, "m.gguf");
    } catch (const Error& e) {
      threw = e.code() == ErrorCode::kInvalidArgument &&
              std::string(e.what()).rfind("m.gguf: ", 0) == 0;
    }
    EXPECT_TRUE(threw) << "a file cut to " << size << " of " << bytes.size() << " bytes";
  }
}

TEST(Gguf, CountsAndLengthsPastTheFileAreRefusedBeforeAllocating) {
  const auto none = [](Writer&) {};
  // 2^40 tensors or pairs in a file of a few bytes.
  Writer w;
  w.bytes() = "GGUF";
  w.put<std::uint32_t>(3).put<std::uint64_t>(std::uint64_t{1} << 40).put<std::uint64_t>(0);
  refused(w.bytes() + std::string(64, '\0'),
          "m.gguf: the tensor count: 1099511627776 tensors, more than the 64 bytes left");
  refused(gguf(std::uint64_t{1} << 40, none, {}, 0),
          "m.gguf: the metadata count: 1099511627776 key-value pairs");
  // A string value of 2^40 bytes.
  refused(gguf(
              1,
              [](Writer& m) {
                m.key("general.name", GgufValueType::kString)
                    .put<std::uint64_t>(std::uint64_t{1} << 40);
              },
              {}, 64),
          "m.gguf: general.name: a string of 1099511627776 bytes, past the end of the file (72 "
          "bytes left)");
  // An array of 2^40 strings, and of 2^40 uint32s.
  refused(gguf(
              1,
              [](Writer& m) {
                m.key("tokenizer.ggml.tokens", GgufValueType::kArray).put<std::uint32_t>(8);
                m.put<std::uint64_t>(std::uint64_t{1} << 40);
              },
              {}, 64),
          "m.gguf: tokenizer.ggml.tokens: an array of 1099511627776 string elements, more than");
  refused(gguf(
              1,
              [](Writer& m) {
                m.key("x", GgufValueType::kArray).put<std::uint32_t>(4);
                m.put<std::uint64_t>(std::uint64_t{1} << 40);
              },
              {}, 64),
          "m.gguf: x: an array of 1099511627776 uint32 elements");
  // A key longer than the format allows.
  refused(gguf(
              1, [](Writer& m) { m.str(std::string(70000, 'k')); }, {}, 64),
          "metadata pair 0 (its key): a string of 70000 bytes, more than the 65535 allowed");
}

TEST(Gguf, TensorsOutsideTheDataOrOverlappingAreRefused) {
  const auto none = [](Writer&) {};
  refused(gguf(0, none, {{"w", {32, 4}, 0, 0}}, 100),
          "m.gguf: tensor \"w\": F32 [32, 4] takes 512 bytes at offset 0, past the data "
          "section's 100 bytes");
  refused(gguf(0, none, {{"w", {16}, 0, 1u << 30}}, 64), "at offset 1073741824, past the data");
  refused(gguf(0, none, {{"a", {16}, 0, 0}, {"b", {16}, 0, 32}}, 128),
          "m.gguf: tensor \"b\": its bytes [32, 96) overlap tensor \"a\"'s, which end at 64");
  refused(gguf(0, none, {{"a", {16}, 0, 8}}, 128),
          "m.gguf: tensor \"a\": offset 8 is not a multiple of the alignment 32");
  refused(gguf(0, none, {{"a", {16}, 0, 0}, {"a", {16}, 0, 64}}, 128),
          "m.gguf: tensor \"a\": appears twice in the tensor table");
  refused(gguf(0, none, {{"w", {100, 2}, 2, 0}}, 1024),
          "tensor \"w\": rows of 100 elements, not a multiple of Q4_0's block of 32");
  refused(gguf(0, none, {{"w", {16}, 77, 0}}, 64), "tensor \"w\": unknown ggml type 77");
  refused(gguf(0, none, {{"w", {16, 0}, 0, 0}}, 64), "tensor \"w\": dimension 1 is 0");
  refused(gguf(0, none, {{"w", {1, 1, 1, 1, 1}, 0, 0}}, 64),
          "tensor \"w\": 5 dimensions, not 1 to 4");
  refused(gguf(0, none, {{"w", {std::uint64_t{1} << 32, std::uint64_t{1} << 32}, 0, 0}}, 64),
          "tensor \"w\": dimension 1 is 4294967296, and the element count overflows");
}

TEST(Gguf, AlignmentVersionsAndValuesAreChecked) {
  const auto alignment = [](std::uint32_t a) {
    return [a](Writer& m) { m.key("general.alignment", GgufValueType::kUint32).put(a); };
  };
  // A 64-byte alignment moves the data section and must hold for offsets.
  const GgufContents c = parse(gguf(1, alignment(64), {{"w", {16}, 0, 64}}, 128, 64));
  EXPECT_EQ(c.alignment, 64u);
  EXPECT_EQ(c.data_offset % 64, 0u);
  refused(gguf(1, alignment(48), {}, 0), "m.gguf: general.alignment: 48 is not a power of two");
  refused(gguf(1, alignment(0), {}, 0), "general.alignment: 0 is not a power of two");
  refused(gguf(
              1,
              [](Writer& m) {
                m.key("general.alignment", GgufValueType::kUint64).put<std::uint64_t>(32);
              },
              {}, 0),
          "general.alignment: a uint64, not a uint32");
  const auto none = [](Writer&) {};
  refused(gguf(0, none, {}, 0, 32, 2), "m.gguf: the version: version 2 (an older format");
  refused(gguf(0, none, {}, 0, 32, 0x03000000u), "a big-endian GGUF file");
  refused(gguf(0, none, {}, 0, 32, 4), "version 4 (unknown), only version 3 is read");
  refused("GGML" + std::string(60, '\0'), "m.gguf: the magic: the file does not start with");
  refused(gguf(
              1, [](Writer& m) { m.key("x", static_cast<GgufValueType>(13)).put<std::uint8_t>(0); },
              {}, 0),
          "m.gguf: x: unknown value type 13");
  refused(gguf(
              1,
              [](Writer& m) {
                m.key("x", GgufValueType::kArray).put<std::uint32_t>(9).put<std::uint64_t>(1);
              },
              {}, 64),
          "m.gguf: x: an array of arrays");
  refused(gguf(
              1, [](Writer& m) { m.key("x", GgufValueType::kBool).put<std::uint8_t>(2); }, {}, 0),
          "m.gguf: x: a bool of 2, not 0 or 1");
  refused(gguf(
              2,
              [](Writer& m) {
                m.key("x", GgufValueType::kUint8).put<std::uint8_t>(1);
                m.key("x", GgufValueType::kUint8).put<std::uint8_t>(2);
              },
              {}, 0),
          "m.gguf: x: appears twice in the metadata");
  refused(
      gguf(
          1, [](Writer& m) { m.key("a\nb", GgufValueType::kUint8).put<std::uint8_t>(1); }, {}, 0),
      "m.gguf: metadata pair 0: key \"a\\x0ab\" is not printable ASCII");
}

// The model a file describes, read as config.json would give it; what cannot be served is refused
// naming the file and the key.
TEST(GgufConfig, MetadataBecomesTheConfigOrIsRefusedByName) {
  const auto model = [](const std::string& arch, float eps = 1e-6f) {
    return [=](Writer& m) {
      m.key("general.architecture", GgufValueType::kString).str(arch);
      const std::string p = arch + ".";
      m.key(p + "block_count", GgufValueType::kUint32).put<std::uint32_t>(2);
      m.key(p + "embedding_length", GgufValueType::kUint32).put<std::uint32_t>(64);
      m.key(p + "feed_forward_length", GgufValueType::kUint32).put<std::uint32_t>(96);
      m.key(p + "attention.head_count", GgufValueType::kUint32).put<std::uint32_t>(4);
      m.key(p + "attention.head_count_kv", GgufValueType::kUint32).put<std::uint32_t>(2);
      m.key(p + "attention.layer_norm_rms_epsilon", GgufValueType::kFloat32).put<float>(eps);
      m.key(p + "vocab_size", GgufValueType::kUint32).put<std::uint32_t>(100);
    };
  };
  const std::string path = ::testing::TempDir() + "gguf_config_test.gguf";
  const auto open_config = [&](const std::string& bytes) { write_file(path, bytes); };
  const std::vector<Tensor> embedding = {{"token_embd.weight", {64, 100}, 0, 0}};
  open_config(gguf(8, model("qwen2"), embedding, 64 * 100 * 4));
  const ModelConfig c = gguf_model_config(GgufFile(path));
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_TRUE(c.qkv_bias);             // Qwen2's family says so, as for its config.json
  EXPECT_TRUE(c.tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c.rms_norm_eps, 1e-6f);

  open_config(gguf(8, model("gemma3"), embedding, 64 * 100 * 4));
  expect_error([&] { gguf_model_config(GgufFile(path)); }, ErrorCode::kInvalidArgument,
               "gguf_config_test.gguf: general.architecture \"gemma3\" is not served (served: "
               "llama, qwen2, qwen3, phi3)");
  open_config(gguf(
      1, [](Writer& m) { m.key("general.architecture", GgufValueType::kString).str("llama"); }, {},
      0));
  expect_error([&] { gguf_model_config(GgufFile(path)); }, ErrorCode::kInvalidArgument,
               "gguf_config_test.gguf: no metadata key llama.embedding_length");
  open_config(gguf(8, model("llama"),
                   {{"token_embd.weight", {64, 100}, 0, 0}, {"rope_freqs.weight", {8}, 0, 25600}},
                   25600 + 32));
  expect_error([&] { gguf_model_config(GgufFile(path)); }, ErrorCode::kInvalidArgument,
               "rope_freqs.weight (rope factors stored as a tensor, as Llama 3.1's files do) is "
               "not read yet");
  // A NaN or an infinity is refused naming the key: it would reach config.json as null, which
  // reads as absent, and the default would be used in its place.
  const auto with_base = [&](double base) {
    return [=](Writer& m) {
      model("llama")(m);
      m.key("llama.rope.freq_base", GgufValueType::kFloat64).put<double>(base);
    };
  };
  const struct {
    std::string bytes;
    const char* message;
  } bad[] = {{gguf(9, with_base(std::nan("")), embedding, 64 * 100 * 4),
              "llama.rope.freq_base is NaN, not a finite number"},
             {gguf(9, with_base(INFINITY), embedding, 64 * 100 * 4),
              "llama.rope.freq_base is infinite, not a finite number"},
             {gguf(8, model("llama", std::nanf("")), embedding, 64 * 100 * 4),
              "llama.attention.layer_norm_rms_epsilon is NaN, not a finite number"},
             {gguf(8, model("llama", -INFINITY), embedding, 64 * 100 * 4),
              "llama.attention.layer_norm_rms_epsilon is infinite, not a finite number"}};
  for (const auto& b : bad) {
    open_config(b.bytes);
    expect_error([&] { gguf_model_config(GgufFile(path)); }, ErrorCode::kInvalidArgument,
                 std::string("gguf_config_test.gguf: ") + b.message);
  }
  std::remove(path.c_str());
}

// The decoder's weights from a file: every tensor under its GGUF name, shapes as GGUF's dimensions
// reversed, types read here; what lacks or differs is refused by name before anything is read.
TEST(GgufWeights, TensorsAreFoundCheckedAndRefusedByName) {
  EXPECT_EQ(gguf_tensor_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.12.self_attn.q_proj.bias"), "blk.12.attn_q.bias");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.mlp.gate_up_proj.weight"), "blk.0.ffn_up.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.3.self_attn.k_norm.weight"), "blk.3.attn_k_norm.weight");
  expect_error([] { gguf_tensor_name("model.layers.0.mlp.experts.weight"); },
               ErrorCode::kInvalidArgument, "has no GGUF name");

  // A one-layer Llama: hidden 32, 2 heads of 16, 1 kv head, ff 64, vocab 8, tied.
  const auto metadata = [](Writer& m) {
    m.key("general.architecture", GgufValueType::kString).str("llama");
    m.key("llama.block_count", GgufValueType::kUint32).put<std::uint32_t>(1);
    m.key("llama.embedding_length", GgufValueType::kUint32).put<std::uint32_t>(32);
    m.key("llama.feed_forward_length", GgufValueType::kUint32).put<std::uint32_t>(64);
    m.key("llama.attention.head_count", GgufValueType::kUint32).put<std::uint32_t>(2);
    m.key("llama.attention.head_count_kv", GgufValueType::kUint32).put<std::uint32_t>(1);
    m.key("llama.attention.layer_norm_rms_epsilon", GgufValueType::kFloat32).put<float>(1e-5f);
    m.key("llama.vocab_size", GgufValueType::kUint32).put<std::uint32_t>(8);
  };
  struct Spec {
    std::string name;
    std::vector<std::uint64_t> dims;
    std::uint32_t type;
  };
  const std::vector<Spec> model = {
      {"token_embd.weight", {32, 8}, 8},    {"blk.0.attn_norm.weight", {32}, 0},
      {"blk.0.attn_q.weight", {32, 32}, 8}, {"blk.0.attn_k.weight", {32, 16}, 2},
      {"blk.0.attn_v.weight", {32, 16}, 3}, {"blk.0.attn_output.weight", {32, 32}, 1},
      {"blk.0.ffn_norm.weight", {32}, 0},   {"blk.0.ffn_gate.weight", {32, 64}, 30},
      {"blk.0.ffn_up.weight", {32, 64}, 0}, {"blk.0.ffn_down.weight", {64, 32}, 8},
      {"output_norm.weight", {32}, 0}};
  const std::string path = ::testing::TempDir() + "gguf_weights_test.gguf";
  const auto write = [&](std::vector<Spec> specs) {
    std::vector<Tensor> tensors;
    std::uint64_t at = 0;
    for (const Spec& spec : specs) {
      const GgmlType* type = ggml_type(spec.type);
      std::uint64_t elements = 1;
      for (std::uint64_t d : spec.dims) elements *= d;
      tensors.push_back({spec.name, spec.dims, spec.type, at});
      at += (elements / type->block * type->block_bytes + 31) / 32 * 32;
    }
    const std::string bytes = gguf(8, metadata, tensors, static_cast<std::size_t>(at));
    write_file(path, bytes);
  };
  const auto check = [&] {
    const GgufFile file(path);
    const ModelConfig c = gguf_model_config(file);
    check_gguf_weights(WeightLayout(c, DType::kF32), file);
  };
  write(model);
  EXPECT_NO_THROW(check());
  {  // the planner counts the blocks both paths keep (and the host's f16 and bf16 matrices), and
     // on CUDA the tile their GEMMs dequantize into (the workspace of the same shape without
     // blocks, plus that tile)
    const GgufFile file(path);
    const WeightLayout plain(gguf_model_config(file), DType::kF32);
    const WeightLayout kept(plain.config(), DType::kF32, gguf_kept_matrices(plain, file, false));
    const WeightLayout host_kept(plain.config(), DType::kF32,
                                 gguf_kept_matrices(plain, file, true));
    EXPECT_EQ(kept.entries()[0].type, ElementType::kQ8_0);  // token_embd in Q8_0
    EXPECT_EQ(kept.entries()[5].type, ElementType::kF32);   // attn_output (F16) expanded on CUDA,
    EXPECT_EQ(host_kept.entries()[5].type, ElementType::kF16);   // kept on the host,
    EXPECT_EQ(host_kept.entries()[7].type, ElementType::kBF16);  // as ffn_gate (BF16),
    EXPECT_EQ(host_kept.entries()[8].type, ElementType::kF32);   // and ffn_up in F32
    EXPECT_FALSE(host_kept.entries()[7].in_blocks());
    EXPECT_EQ(host_kept.bytes(), kept.bytes() - 32 * 32 * 2 - 64 * 32 * 2);
    EXPECT_TRUE(host_kept.has_other_types());
    // In an f16 model the F16 and BF16 matrices are that model's: nothing more kept.
    const WeightLayout half(plain.config(), DType::kF16);
    EXPECT_EQ(gguf_kept_matrices(half, file, true), gguf_kept_matrices(half, file, false));
    MemoryQuery q;
    q.model = path;
    q.max_seq = 64;
    q.backend = BackendKind::kHost;
    EXPECT_EQ(plan_memory(q).weights_bytes, host_kept.bytes());
    // The host path's scratch: the GEMM tiles of the blocks' rows dequantized, among the rest.
    const MemoryPlan host = plan_memory(q);
    const DecoderOptions ho = decoder_options(q);
    const DecoderMemory hm = plan_decoder_memory(plain.config(), ho, BackendKind::kHost);
    DecoderOptions blocks = ho;
    blocks.weights_in_blocks = true;
    EXPECT_EQ(host.workspace_bytes,
              HostWorkspaceLayout(host_ops_shape(plain.config(), blocks, hm)).bytes);
    EXPECT_GT(host.workspace_bytes,
              HostWorkspaceLayout(host_ops_shape(plain.config(), ho, hm)).bytes);
    q.backend = BackendKind::kCuda;
    const MemoryPlan cuda = plan_memory(q);
    EXPECT_EQ(cuda.weights_bytes, kept.bytes());
    EXPECT_LT(kept.bytes(), plain.bytes());
    const ModelConfig c = plain.config();
    DecoderOptions o = decoder_options(q);
    o.weights_bytes = kept.bytes();
    o.weights_in_blocks = true;
    const DecoderMemory with = plan_decoder_memory(c, o, BackendKind::kCuda);
    o.weights_in_blocks = false;
    const DecoderMemory without = plan_decoder_memory(c, o, BackendKind::kCuda);
    EXPECT_EQ(cuda.workspace_bytes, with.workspace);
    // This small model's tile: its tallest matrix's rows rounded up to 128, of its widest input,
    // in f32 (64 MiB would hold far more rows).
    const std::uint64_t widest = static_cast<std::uint64_t>(
        std::max({c.hidden_size, c.intermediate_size, static_cast<int>(c.q_dim())}));
    const std::uint64_t tallest = static_cast<std::uint64_t>(
        std::max({c.vocab_size, c.intermediate_size, static_cast<int>(c.q_dim()), c.hidden_size}));
    const std::uint64_t rows = (tallest + 127) / 128 * 128;
    EXPECT_EQ(with.workspace - without.workspace, (rows * widest * 4 + 255) / 256 * 256);
    // expand_weights: every matrix planned in the model dtype, as kvo-generate --expand-weights
    // loads them, on either path, with no tile of blocks in the workspace.
    q.expand_weights = true;
    for (const BackendKind backend : {BackendKind::kHost, BackendKind::kCuda}) {
      q.backend = backend;
      const MemoryPlan expanded = plan_memory(q);
      EXPECT_EQ(expanded.weights_bytes, plain.bytes()) << backend_name(backend);
      DecoderOptions eo = decoder_options(q);
      EXPECT_FALSE(eo.keep_blocks);
      EXPECT_EQ(expanded.workspace_bytes, plan_decoder_memory(c, eo, backend).workspace)
          << backend_name(backend);
    }
    // q8 activations: planned where the decoder runs them (the host, blocks kept), refused as the
    // decoder refuses them elsewhere.
    q.q8_activations = true;
    q.backend = BackendKind::kHost;
    expect_error([&] { plan_memory(q); }, ErrorCode::kInvalidArgument,
                 "q8 activations multiply weights kept in GGUF blocks on the host backend (a "
                 "GGUF file, or --weights q8_0); these weights are not in blocks");
    q.expand_weights = false;
    EXPECT_GT(plan_memory(q).workspace_bytes, host.workspace_bytes);  // the 8-bit rows' scratch
    q.backend = BackendKind::kCuda;
    expect_error([&] { plan_memory(q); }, ErrorCode::kInvalidArgument,
                 "the CUDA path multiplies f32 activations");
    q.expand_weights = true;
    expect_error([&] { plan_memory(q); }, ErrorCode::kInvalidArgument,
                 "the CUDA path multiplies f32 activations");
  }
  {  // a file of F16 and BF16 matrices alone: kept on the host, but no blocks for q8 activations
    auto halves = model;
    for (Spec& spec : halves) {
      if (spec.type != 0 && spec.type != 30) spec.type = 1;  // F32 and BF16 stay, the rest F16
    }
    write(halves);
    MemoryQuery q;
    q.model = path;
    q.max_seq = 64;
    q.backend = BackendKind::kHost;
    const GgufFile file(path);
    const WeightLayout plain(gguf_model_config(file), DType::kF32);
    EXPECT_LT(plan_memory(q).weights_bytes, plain.bytes());
    q.q8_activations = true;
    expect_error([&] { plan_memory(q); }, ErrorCode::kInvalidArgument,
                 "these weights are not in blocks");
    write(model);
  }
  {  // every element of a zero file reads as 0 (F32, F16, BF16, Q8_0, Q4_0 and Q4_1 blocks)
    const GgufFile file(path);
    const WeightLayout layout(gguf_model_config(file), DType::kF32);
    std::vector<float> region(layout.bytes() / sizeof(float), -1.0f);
    load_gguf_weights(layout, file, [&](std::size_t offset, const void* host, std::size_t bytes) {
      ASSERT_LE(offset + bytes, layout.bytes());
      std::memcpy(reinterpret_cast<char*>(region.data()) + offset, host, bytes);
    });
    for (const WeightEntry& e : layout.entries()) {
      const float* v = region.data() + e.offset / sizeof(float);
      EXPECT_EQ(std::count(v, v + e.elements, 0.0f), e.elements) << e.name;
    }
  }
  auto missing = model;
  missing.erase(missing.begin() + 4);
  write(missing);
  expect_error(check, ErrorCode::kInvalidArgument,
               "gguf_weights_test.gguf: tensor blk.0.attn_v.weight "
               "(model.layers.0.self_attn.v_proj.weight) is missing");
  auto shape = model;
  shape[3].dims = {32, 32};
  write(shape);
  expect_error(check, ErrorCode::kInvalidArgument,
               "tensor blk.0.attn_k.weight has shape [32, 32] (GGUF's dimensions reversed), the "
               "model's metadata needs [16, 32]");
  auto type = model;
  type[2].type = 6;  // Q5_0: a type the reader knows, not one the decoder reads
  write(type);
  expect_error(check, ErrorCode::kInvalidArgument,
               "tensor blk.0.attn_q.weight is Q5_0, which is not read");
  auto extra = model;
  extra.push_back({"blk.1.attn_norm.weight", {32}, 0});
  write(extra);
  expect_error(check, ErrorCode::kInvalidArgument,
               "tensor blk.1.attn_norm.weight is past the 1 layers of the model's metadata");
  std::remove(path.c_str());
}

// A file of f16 and bf16 matrices with random values (norms and Qwen2's biases in F32): on the
// host the decoder keeps the matrices in their type inside the f32 model, in about half the
// bytes, and gives the logits of the same file expanded to f32 at load bit for bit, over a prompt
// past the GEMM threshold (tiles widened into the panel) and decode steps (rows widened in
// registers): a Llama with its own output matrix, a Qwen2 with biases and the embedding as head.
TEST(GgufWeights, HalfMatricesKeptOnTheHostGiveTheExpandedLogits) {
  const std::string path = ::testing::TempDir() + "gguf_half_test.gguf";
  for (const std::string arch : {"llama", "qwen2"}) {
    SCOPED_TRACE(arch);
    const bool qwen = arch == "qwen2";
    const auto metadata = [&](Writer& m) {
      m.key("general.architecture", GgufValueType::kString).str(arch);
      m.key(arch + ".block_count", GgufValueType::kUint32).put<std::uint32_t>(2);
      m.key(arch + ".embedding_length", GgufValueType::kUint32).put<std::uint32_t>(64);
      m.key(arch + ".feed_forward_length", GgufValueType::kUint32).put<std::uint32_t>(128);
      m.key(arch + ".attention.head_count", GgufValueType::kUint32).put<std::uint32_t>(4);
      m.key(arch + ".attention.head_count_kv", GgufValueType::kUint32).put<std::uint32_t>(2);
      m.key(arch + ".attention.layer_norm_rms_epsilon", GgufValueType::kFloat32).put<float>(1e-5f);
      m.key(arch + ".vocab_size", GgufValueType::kUint32).put<std::uint32_t>(48);
      m.key(arch + ".context_length", GgufValueType::kUint32).put<std::uint32_t>(256);
    };
    constexpr std::uint32_t kF32 = 0, kF16 = 1, kBF16 = 30;
    std::vector<Tensor> tensors;
    std::uint64_t at = 0;
    const auto add = [&](const std::string& name, std::vector<std::uint64_t> dims,
                         std::uint32_t type) {
      std::uint64_t elements = 1;
      for (std::uint64_t d : dims) elements *= d;
      tensors.push_back({name, std::move(dims), type, at});
      at += (elements * (type == kF32 ? 4 : 2) + 31) / 32 * 32;
    };
    add("token_embd.weight", {64, 48}, kF16);
    for (int l = 0; l < 2; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      add(b + "attn_norm.weight", {64}, kF32);
      add(b + "attn_q.weight", {64, 64}, kBF16);
      add(b + "attn_k.weight", {64, 32}, kF16);
      add(b + "attn_v.weight", {64, 32}, kBF16);
      if (qwen) {
        add(b + "attn_q.bias", {64}, kF32);
        add(b + "attn_k.bias", {32}, kF32);
        add(b + "attn_v.bias", {32}, kF32);
      }
      add(b + "attn_output.weight", {64, 64}, kF16);
      add(b + "ffn_norm.weight", {64}, kF32);
      add(b + "ffn_gate.weight", {64, 128}, kBF16);
      add(b + "ffn_up.weight", {64, 128}, kF16);
      add(b + "ffn_down.weight", {128, 64}, kBF16);
    }
    add("output_norm.weight", {64}, kF32);
    if (!qwen) add("output.weight", {64, 48}, kBF16);
    std::string bytes = gguf(9, metadata, tensors, static_cast<std::size_t>(at));
    const std::size_t data = bytes.size() - static_cast<std::size_t>(at);
    std::mt19937 rng(arch.size());
    std::normal_distribution<float> normal;
    for (const Tensor& t : tensors) {
      const bool vector = t.dims.size() == 1;
      const bool norm = t.name.find("norm") != std::string::npos;
      const float scale = vector ? 0.1f : 1.0f / std::sqrt(static_cast<float>(t.dims[0]));
      std::uint64_t elements = 1;
      for (std::uint64_t d : t.dims) elements *= d;
      char* out = bytes.data() + data + t.offset;
      for (std::uint64_t i = 0; i < elements; ++i) {
        const float v = (norm ? 1.0f : 0.0f) + scale * normal(rng);
        if (t.type == kF32) {
          std::memcpy(out + i * 4, &v, 4);
        } else {
          const std::uint16_t h = t.type == kF16 ? float_to_f16(v) : float_to_bf16(v);
          std::memcpy(out + i * 2, &h, 2);
        }
      }
    }
    write_file(path, bytes);
    const ModelConfig c = gguf_model_config(GgufFile(path));
    ASSERT_EQ(c.tie_word_embeddings, qwen);
    DecoderOptions keep = testing::host_options(40);
    keep.chunk = 24;
    DecoderOptions expand = keep;
    expand.keep_blocks = false;
    Decoder kept(c, WeightSource{path, 0}, keep);
    Decoder expanded(c, WeightSource{path, 0}, expand);
    EXPECT_LT(kept.weight_bytes(), expanded.weight_bytes() * 5 / 8);
    EXPECT_NE(kept.weights_text().find("matrices in bf16, widened as read"), std::string::npos)
        << kept.weights_text();
    EXPECT_EQ(kept.weights_text(false), "f32");  // a saved context's: as the expanded load's
    EXPECT_EQ(expanded.weights_text(), "f32");
    std::vector<float> a(48), b(48);
    const std::vector<std::int32_t> prompt = testing::random_prompt(24, 48, 3);
    kept.prefill(0, prompt, a.data());
    expanded.prefill(0, prompt, b.data());
    ASSERT_GT(*std::max_element(a.begin(), a.end()) - *std::min_element(a.begin(), a.end()), 0.1f);
    EXPECT_EQ(a, b) << "prefill";
    for (int t = 0; t < 4; ++t) {
      const auto next = static_cast<std::int32_t>(std::max_element(a.begin(), a.end()) - a.begin());
      kept.decode({next}, a.data());
      expanded.decode({next}, b.data());
      EXPECT_EQ(a, b) << "decode " << t;
    }
  }
  std::remove(path.c_str());
}

// The tokenizer inside a file: tokens, merges, control tokens kept whole and special; a token
// written in plain UTF-8 read in GPT-2's byte alphabet; SentencePiece files refused by name.
TEST(GgufTokenizer, ByteLevelBpeFromTheFileAndRefusals) {
  const std::string path = ::testing::TempDir() + "gguf_tokenizer_test.gguf";
  const auto write = [&](const std::string& model, const std::string& merge) {
    const std::string bytes = gguf(
        6,
        [&](Writer& m) {
          m.key("general.architecture", GgufValueType::kString).str("llama");
          m.key("tokenizer.ggml.model", GgufValueType::kString).str(model);
          m.key("tokenizer.ggml.tokens", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(7).str("a").str("b").str("ab").str("<s>").str(" x");
          m.str("\xc4\xa0").str("x");  // U+0120, the byte alphabet's letter for the space
          m.key("tokenizer.ggml.token_type", GgufValueType::kArray).put<std::uint32_t>(5);
          m.put<std::uint64_t>(7);
          for (std::int32_t t : {1, 1, 1, 3, 1, 1, 1}) m.put<std::int32_t>(t);
          m.key("tokenizer.ggml.merges", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(2).str(merge).str("\xc4\xa0 x");
          m.key("tokenizer.ggml.eos_token_id", GgufValueType::kUint32).put<std::uint32_t>(3);
        },
        {}, 0);
    write_file(path, bytes);
  };
  write("gpt2", "a b");
  const std::unique_ptr<Tokenizer> t = load_tokenizer(path);  // a file: its GGUF tokenizer
  EXPECT_EQ(t->encode("ab", false), (std::vector<std::int32_t>{2}));
  EXPECT_EQ(t->encode("<s>ab", false), (std::vector<std::int32_t>{3, 2}));
  EXPECT_TRUE(t->is_special(3));
  EXPECT_EQ(t->eos_id(), std::optional<std::int32_t>(3));
  // " x" is written plain in the file (a space is no letter of the byte alphabet): read as the
  // letters of its bytes, which the merge (in the byte alphabet, as files write merges) makes.
  EXPECT_EQ(t->encode(" x", false), (std::vector<std::int32_t>{4}));
  EXPECT_EQ(t->decode({2, 4}, false), "ab x");

  write("rwkv", "a b");
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "gguf_tokenizer_test.gguf: tokenizer.ggml.model \"rwkv\" is not read (gpt2, "
               "byte-level BPE, and llama, SentencePiece, are)");
  write("llama", "a b");  // SentencePiece needs the tokens' scores
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument, "tokenizer.ggml.scores");
  write("gpt2", "ab");
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.merges: \"ab\" is not two tokens");

  // A vocabulary maps ids and tokens one to one, types its tokens 1 to 6, and has a token for
  // every byte its tokens spell.
  const auto vocabulary = [&](const std::vector<std::string>& tokens,
                              const std::vector<std::int32_t>& types) {
    const std::string bytes = gguf(
        4,
        [&](Writer& m) {
          m.key("tokenizer.ggml.model", GgufValueType::kString).str("gpt2");
          m.key("tokenizer.ggml.tokens", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(tokens.size());
          for (const std::string& token : tokens) m.str(token);
          m.key("tokenizer.ggml.token_type", GgufValueType::kArray).put<std::uint32_t>(5);
          m.put<std::uint64_t>(types.size());
          for (std::int32_t type : types) m.put<std::int32_t>(type);
          m.key("tokenizer.ggml.merges", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(1).str("a b");
        },
        {}, 0);
    write_file(path, bytes);
  };
  const std::vector<std::string> cat = {"a", "b", "ab", "t", "h", "e", "c", "\xc4\xa0"};
  vocabulary(cat, {1, 1, 1, 1, 1, 1, 1, 1});
  EXPECT_EQ(load_tokenizer(path)->encode("the cat", false),
            (std::vector<std::int32_t>{3, 4, 5, 7, 6, 0, 3}));
  std::vector<std::string> twice = cat;
  twice.push_back("a");  // "the cat" would lose an id, and encode as "the ct"
  vocabulary(twice, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.tokens holds 'a' twice, as tokens 0 and 8");
  std::vector<std::string> respelled = cat;
  respelled.push_back(" ");  // plain UTF-8, read as "\u0120": the spelling of token 7
  vocabulary(respelled, {1, 1, 1, 1, 1, 1, 1, 1, 1});
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "holds '\\xc4\\xa0' twice, as tokens 7 and 8");
  for (const std::int32_t type : {-7, 0, 7, 2147483647}) {
    vocabulary(cat, {1, 1, type, 1, 1, 1, 1, 1});
    expect_error(
        [&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
        "tokenizer.ggml.token_type of token 2 is " + std::to_string(type) + ", not 1 to 6");
  }
  std::vector<std::string> no_c = cat;
  no_c[6] = "ca";  // spells 'c', and no token is 'c' alone
  vocabulary(no_c, {1, 1, 1, 1, 1, 1, 1, 1});
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "has tokens spelling byte 0x63 ('c') but no token of that byte alone");
  std::remove(path.c_str());
}

// A SentencePiece ("llama") vocabulary: pieces merged by their scores, spaces as U+2581 with one in
// front of the text, BOS added unless the file says not, control tokens kept whole.
TEST(GgufTokenizer, SentencePieceFromTheFile) {
  const std::string path = ::testing::TempDir() + "gguf_spm_test.gguf";
  const auto write = [&](std::int32_t unknown_type, bool add_bos) {
    const std::string bytes = gguf(
        8,  // BOS is "<bos>", typed normal: found by its id, as transformers finds it
        [&](Writer& m) {
          m.key("general.architecture", GgufValueType::kString).str("llama");
          m.key("tokenizer.ggml.model", GgufValueType::kString).str("llama");
          m.key("tokenizer.ggml.tokens", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(8).str("<unk>").str("<bos>").str("</s>").str("\xe2\x96\x81");
          m.str("a")
              .str("b")
              .str(
                  "\xe2\x96\x81"
                  "a")
              .str("ab");
          m.key("tokenizer.ggml.scores", GgufValueType::kArray).put<std::uint32_t>(6);
          m.put<std::uint64_t>(8);
          for (float s : {0.0f, 0.0f, 0.0f, -1.0f, -2.0f, -3.0f, -0.5f, -4.0f}) m.put<float>(s);
          m.key("tokenizer.ggml.token_type", GgufValueType::kArray).put<std::uint32_t>(5);
          m.put<std::uint64_t>(8);
          for (std::int32_t t : {unknown_type, 1, 3, 1, 1, 1, 1, 1}) m.put<std::int32_t>(t);
          m.key("tokenizer.ggml.bos_token_id", GgufValueType::kUint32).put<std::uint32_t>(1);
          m.key("tokenizer.ggml.eos_token_id", GgufValueType::kUint32).put<std::uint32_t>(2);
          m.key("tokenizer.ggml.add_bos_token", GgufValueType::kBool)
              .put<std::uint8_t>(add_bos ? 1 : 0);
        },
        {}, 0);
    write_file(path, bytes);
  };
  write(2, true);
  std::unique_ptr<Tokenizer> t = load_tokenizer(path);
  EXPECT_EQ(t->kind(), "SentencePiece (from the GGUF file)");
  // "a b" is "\u2581a\u2581b": "\u2581a" (score -0.5) merges first, the second "\u2581" has no
  // partner; "ab" (-4) is never reached.
  EXPECT_EQ(t->encode("a b", false), (std::vector<std::int32_t>{6, 3, 5}));
  EXPECT_EQ(t->encode("a b", true), (std::vector<std::int32_t>{1, 6, 3, 5}));
  EXPECT_EQ(t->encode("a</s>b", false), (std::vector<std::int32_t>{6, 2, 5}));
  EXPECT_EQ(t->decode({6, 3, 5}, false), "a b");
  EXPECT_EQ(t->eos_id(), std::optional<std::int32_t>(2));
  write(2, false);
  EXPECT_EQ(load_tokenizer(path)->encode("a b", true), (std::vector<std::int32_t>{6, 3, 5}));
  write(1, true);  // no unknown token
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "gguf_spm_test.gguf: a SentencePiece vocabulary needs an unknown token");
  write(9, true);
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.token_type of token 0 is 9, not 1 to 6");

  // Scores are finite, pieces distinct, and what SentencePiece itself refuses reaches the user
  // with its reason.
  const auto pieces = [&](const std::vector<std::string>& tokens, float score3) {
    const std::string bytes = gguf(
        5,
        [&](Writer& m) {
          m.key("tokenizer.ggml.model", GgufValueType::kString).str("llama");
          m.key("tokenizer.ggml.tokens", GgufValueType::kArray).put<std::uint32_t>(8);
          m.put<std::uint64_t>(tokens.size());
          for (const std::string& token : tokens) m.str(token);
          m.key("tokenizer.ggml.scores", GgufValueType::kArray).put<std::uint32_t>(6);
          m.put<std::uint64_t>(tokens.size());
          for (std::size_t i = 0; i < tokens.size(); ++i) m.put<float>(i == 3 ? score3 : -1.0f);
          m.key("tokenizer.ggml.token_type", GgufValueType::kArray).put<std::uint32_t>(5);
          m.put<std::uint64_t>(tokens.size());
          for (std::size_t i = 0; i < tokens.size(); ++i) m.put<std::int32_t>(i == 0 ? 2 : 1);
          m.key("tokenizer.ggml.eos_token_id", GgufValueType::kUint32).put<std::uint32_t>(2);
        },
        {}, 0);
    write_file(path, bytes);
  };
  const std::vector<std::string> good = {"<unk>", "<s>", "</s>", "a", "b"};
  pieces(good, -2.0f);
  EXPECT_EQ(load_tokenizer(path)->vocab_size(), 5);
  pieces(good, std::nanf(""));
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.scores of token 3 is NaN, not a finite number");
  pieces(good, INFINITY);
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.scores of token 3 is inf, not a finite number");
  pieces({"<unk>", "<s>", "</s>", "a", "a"}, -2.0f);
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "tokenizer.ggml.tokens holds 'a' twice, as tokens 3 and 4");
  pieces({"<unk>", "<s>", "</s>", "", "b"}, -2.0f);
  expect_error([&] { load_tokenizer(path); }, ErrorCode::kInvalidArgument,
               "not a SentencePiece model the library can read (a protobuf ModelProto): piece "
               "must not be empty");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvo::model
