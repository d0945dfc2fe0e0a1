// Logits against Hugging Face transformers: the same random weights, written by save_pretrained
// and loaded here, on the host path in f32. The references come from tools/hf_reference.py
// (run by ctest as a fixture); KVO_HF_REFERENCE_DIR points at them.
#include <cstdlib>
#include <fstream>

#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/model_test_util.hpp"
#include "model/reference_forward.hpp"

namespace kvo::model {
namespace {

// A reference run (tools/hf_reference.py): the prompt and transformers' logits of every position.
struct Reference {
  explicit Reference(const std::string& dir) : file(dir + "/reference.safetensors") {
    const TensorInfo& ids_info = file.tensors().at("input_ids");
    const auto* ids_f = reinterpret_cast<const float*>(ids_info.data);
    ids.assign(ids_f, ids_f + ids_info.shape[0]);
    logits = reinterpret_cast<const float*>(file.tensors().at("logits").data);
    vocab = file.tensors().at("logits").shape[1];
  }
  SafetensorsFile file;
  std::vector<std::int32_t> ids;
  const float* logits = nullptr;
  std::int64_t vocab = 0;
};

// The streamed f32 decoder of the tests: the first 8 tokens prefilled in chunks of 3, the rest
// decoded one at a time, so every position from 7 on goes through both attention paths.
constexpr int kFirst = 8;
DecoderOptions streamed_f32(int tokens) {
  DecoderOptions o = testing::host_options(tokens);
  o.chunk = 3;
  o.resident_layers = 0;
  o.override_dtype = true;
  o.dtype = DType::kF32;
  return o;
}

// Runs the reference's prompt through a decoder of `c` reading `source` and checks every
// position from kFirst - 1 on, the decoder's logits and transformers', against the float32
// bounds of `model` (the double-precision reference of the same weights, tests/model/
// reference_forward.hpp, modelling RMSNorm's mean as a float32 sum too, as transformers takes
// it): both evaluations must lie within them.
// `resident`: every layer kept on the device (else every layer streamed).
void check_positions(const char* name, const ModelConfig& c, const WeightSource& source,
                     testing::ReferenceModel& model, const Reference& ref, bool resident = false) {
  ASSERT_EQ(ref.vocab, c.vocab_size);
  const int n = static_cast<int>(ref.ids.size());
  DecoderOptions options = streamed_f32(n);
  if (resident) options.resident_layers = c.layers;
  Decoder d(c, source, options);
  model.round_mean_square(true);
  model.prefill_forward(
      kFirst);  // the forwards below, which dynamic's and longrope's tables follow
  const testing::Bounded exact = model.logits(ref.ids);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  d.prefill(0, std::vector<std::int32_t>(ref.ids.begin(), ref.ids.begin() + kFirst), logits.data());
  double worst = 0, worst_hf = 0;
  const auto check = [&](const float* ours, int pos, const char* who) {
    const testing::BoundCheck b =
        testing::check_within(ours, exact.vr(pos), exact.er(pos), exact.sr(pos), c.vocab_size);
    EXPECT_TRUE(b.within()) << name << " " << who << " position " << pos << ": logit "
                            << b.worst_index << " off by " << b.worst_error << ", " << b.worst_share
                            << " of its bound; mean (error/sigma)^2 " << b.mean_square();
    return b.worst_share;
  };
  for (int pos = kFirst - 1; pos < n; ++pos) {
    if (pos >= kFirst) d.decode({ref.ids[static_cast<std::size_t>(pos)]}, logits.data());
    worst = std::max(worst, check(logits.data(), pos, "kvoffload"));
    worst_hf = std::max(worst_hf, check(ref.logits + static_cast<std::int64_t>(pos) * c.vocab_size,
                                        pos, "transformers"));
  }
  std::printf("%s: worst error %.3g of the float32 bound (transformers: %.3g) over %d positions\n",
              name, worst, worst_hf, n - kFirst + 1);
}

class HfReference : public ::testing::TestWithParam<const char*> {};

TEST_P(HfReference, LogitsMatchTransformers) {
  const char* root = std::getenv("KVO_HF_REFERENCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "KVO_HF_REFERENCE_DIR is not set";
  const std::string dir = std::string(root) + "/" + GetParam();
  const ModelConfig c = load_model_config(dir + "/config.json");
  const Reference ref(dir);
  const std::vector<std::int32_t>& ids = ref.ids;
  const int n = static_cast<int>(ids.size());
  testing::ReferenceModel model(c, dir, DType::kF32);
  check_positions(GetParam(), c, WeightSource{dir, 0}, model, ref);
  check_positions((std::string(GetParam()) + " resident").c_str(), c, WeightSource{dir, 0}, model,
                  ref, /*resident=*/true);

  // The whole prompt in one prefill gives the last position too (in one forward, whose rope
  // table dynamic and longrope choose by its whole length).
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  Decoder whole(c, WeightSource{dir, 0}, streamed_f32(n));
  whole.prefill(0, ids, logits.data());
  if (rope_depends_on_length(c.rope_scaling)) model.prefill_forward(0);
  const testing::Bounded whole_exact = model.logits(ids);
  const testing::BoundCheck b =
      testing::check_within(logits.data(), whole_exact.vr(n - 1), whole_exact.er(n - 1),
                            whole_exact.sr(n - 1), c.vocab_size);
  EXPECT_TRUE(b.within()) << GetParam() << " one prefill: logit " << b.worst_index << " off by "
                          << b.worst_error << ", " << b.worst_share << " of its bound";
}

// The rope table of each scaling type against the one transformers' rope_init_fn gives for a
// forward of the same length (rope.safetensors): at positions 0, 1, the pretraining length - 1
// and its length, and 4 times beyond. Both evaluate the same float32 operations in the same
// order; pow may differ by an ulp between libraries (torch's vectorized pow is within 1 ulp, as
// is glibc's powf), which the reciprocal carries through and the blends of yarn and llama3
// (a weighted sum of two such values) do not amplify: 4 u relative.
TEST_P(HfReference, RopeTablesMatchTransformers) {
  const char* root = std::getenv("KVO_HF_REFERENCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "KVO_HF_REFERENCE_DIR is not set";
  const std::string dir = std::string(root) + "/" + GetParam();
  const ModelConfig c = load_model_config(dir + "/config.json");
  if (c.rope_scaling.type == RopeType::kDefault) {
    EXPECT_FALSE(std::ifstream(dir + "/rope.safetensors").good()) << GetParam();
    return;
  }
  const SafetensorsFile tables(dir + "/rope.safetensors");
  const TensorInfo& lengths = tables.tensors().at("lengths");
  const auto* len = reinterpret_cast<const float*>(lengths.data);
  const auto* inv = reinterpret_cast<const float*>(tables.tensors().at("inv_freq").data);
  const auto* scale = reinterpret_cast<const float*>(tables.tensors().at("scale").data);
  const int half = c.head_dim / 2;
  ASSERT_EQ(tables.tensors().at("inv_freq").shape[1], half);
  for (std::int64_t row = 0; row < lengths.shape[0]; ++row) {
    const auto seq_len = static_cast<std::int64_t>(len[row]);
    const RopeTable ours = rope_table(c, seq_len);
    EXPECT_NEAR(ours.scale, scale[row], 2 * testing::kU * scale[row])
        << GetParam() << " " << seq_len;
    for (int i = 0; i < half; ++i) {
      const double expected = inv[row * half + i];
      EXPECT_NEAR(ours.inv_freq[static_cast<std::size_t>(i)], expected, 4 * testing::kU * expected)
          << GetParam() << " length " << seq_len << " pair " << i;
    }
  }
}

// A GGUF file of each block type (tools/hf_reference.py's gguf_* cases): the decoder reads the
// file itself (its metadata as the config, its blocks dequantized, a Llama's q and k rows put back
// in order) and its logits must lie within the float32 bounds of the double-precision reference
// of the weights transformers' GGUF loader read from the same file (saved beside it), as
// transformers' own logits from those weights must.
class GgufReference : public ::testing::TestWithParam<const char*> {};

TEST_P(GgufReference, LogitsMatchTransformersReadingTheSameFile) {
  const char* root = std::getenv("KVO_HF_REFERENCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "KVO_HF_REFERENCE_DIR is not set";
  const std::string dir = std::string(root) + "/" + GetParam();
  const ModelConfig saved = load_model_config(dir + "/config.json");
  const ModelConfig c = gguf_model_config(GgufFile(dir + "/model.gguf"));
  EXPECT_EQ(c.architecture, saved.architecture);
  EXPECT_EQ(c.layers, saved.layers);
  EXPECT_EQ(c.vocab_size, saved.vocab_size);
  EXPECT_EQ(c.head_dim, saved.head_dim);
  EXPECT_EQ(c.kv_heads, saved.kv_heads);
  EXPECT_EQ(c.tie_word_embeddings, saved.tie_word_embeddings);
  EXPECT_EQ(c.qkv_bias, saved.qkv_bias);
  testing::ReferenceModel model(saved, dir, DType::kF32);
  const Reference ref(dir);
  const WeightSource file{dir + "/model.gguf", 0};
  check_positions(GetParam(), c, file, model, ref);  // the quantized matrices kept in blocks

  // Kept in blocks (or in f16 and bf16), the weights take the file's bytes, and every logit is
  // the one the same weights expanded to f32 at load give: a row or a tile is dequantized (or
  // widened) into f32 and multiplied as an f32 row or panel is; a bias stays f32.
  const int n = static_cast<int>(ref.ids.size());
  DecoderOptions keep = streamed_f32(n);
  keep.chunk = n;  // the prompt in one chunk: past HostLinear::kGemmMinRows, the GEMM tiles
  DecoderOptions expand = keep;
  expand.keep_blocks = false;
  Decoder kept(c, file, keep);
  Decoder expanded(c, file, expand);
  const std::string name = GetParam();
  const auto ends_with = [&](const std::string& end) {
    return name.size() >= end.size() &&
           name.compare(name.size() - end.size(), end.size(), end) == 0;
  };
  const bool half = ends_with("f16");  // f16 and bf16
  const bool quantized = !half && !ends_with("f32");
  EXPECT_EQ(kept.weight_bytes() < expanded.weight_bytes() * 3 / 8, quantized)
      << kept.weight_bytes() << " bytes kept, " << expanded.weight_bytes() << " expanded";
  EXPECT_EQ(kept.weight_bytes() < expanded.weight_bytes() * 5 / 8, quantized || half)
      << kept.weight_bytes() << " bytes kept, " << expanded.weight_bytes() << " expanded";
  EXPECT_EQ(kept.weights_text().find("widened as read") != std::string::npos, half)
      << kept.weights_text();
  if (half) {  // a saved context's format: the expanded load's, as the keys' bits are
    EXPECT_EQ(kept.weights_text(false), expanded.weights_text(false));
  }
  std::vector<float> a(static_cast<std::size_t>(c.vocab_size));
  std::vector<float> b(a.size());
  const std::vector<std::int32_t> prompt(ref.ids.begin(), ref.ids.end() - 4);
  kept.prefill(0, prompt, a.data());
  expanded.prefill(0, prompt, b.data());
  EXPECT_EQ(a, b) << GetParam() << " prefill";
  for (int t = 0; t < 4; ++t) {  // then decodes: the rows
    const std::int32_t next = ref.ids[prompt.size() + static_cast<std::size_t>(t)];
    kept.decode({next}, a.data());
    expanded.decode({next}, b.data());
    EXPECT_EQ(a, b) << GetParam() << " decode " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(BlockTypes, GgufReference,
                         ::testing::Values("gguf_llama_f32", "gguf_llama_f16", "gguf_llama_bf16",
                                           "gguf_llama_q8_0", "gguf_llama_q4_0", "gguf_llama_q4_1",
                                           "gguf_llama_q4_k", "gguf_llama_q5_k", "gguf_llama_q6_k",
                                           "gguf_qwen2_q8_0", "gguf_qwen2_q4_k",
                                           "gguf_qwen2_bf16"));

INSTANTIATE_TEST_SUITE_P(Architectures, HfReference,
                         ::testing::Values("llama31", "mistral", "qwen2", "llama_linear",
                                           "llama_dynamic", "qwen2_yarn", "llama_longrope", "qwen3",
                                           "phi3", "gemma2", "gemma3", "granite", "olmo2"));

// Checkpoints kvo-make-model wrote (tools/hf_reference.py's made_* cases), transformers'
// logits computed from those files: our config.json means to transformers what it means here.
INSTANTIATE_TEST_SUITE_P(Made, HfReference,
                         ::testing::Values("made_gemma2", "made_gemma3_text", "made_granite",
                                           "made_olmo2"));

}  // namespace
}  // namespace kvo::model
