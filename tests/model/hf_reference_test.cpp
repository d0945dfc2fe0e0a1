// Logits against Hugging Face transformers: the same random weights, written by save_pretrained
// and loaded here, on the host path in f32. The references come from tools/hf_reference.py
// (run by ctest as a fixture); KVO_HF_REFERENCE_DIR points at them.
#include <cstdlib>
#include <fstream>

#include "model/checkpoint/safetensors.hpp"
#include "model/model_test_util.hpp"
#include "model/reference_forward.hpp"

namespace kvo::model {
namespace {

class HfReference : public ::testing::TestWithParam<const char*> {};

TEST_P(HfReference, LogitsMatchTransformers) {
  const char* root = std::getenv("KVO_HF_REFERENCE_DIR");
  if (root == nullptr) GTEST_SKIP() << "KVO_HF_REFERENCE_DIR is not set";
  const std::string dir = std::string(root) + "/" + GetParam();
  const ModelConfig c = load_model_config(dir + "/config.json");
  const SafetensorsFile reference(dir + "/reference.safetensors");
  const TensorInfo& ids_info = reference.tensors().at("input_ids");
  const TensorInfo& logits_info = reference.tensors().at("logits");
  const auto* ids_f = reinterpret_cast<const float*>(ids_info.data);
  const auto* expected = reinterpret_cast<const float*>(logits_info.data);
  const int n = static_cast<int>(ids_info.shape[0]);
  ASSERT_EQ(logits_info.shape[1], c.vocab_size);
  std::vector<std::int32_t> ids(ids_f, ids_f + n);

  // Prefill the first 8 tokens in chunks of 3, decode the rest one at a time: every position
  // from 7 on is compared, through both attention paths. Streamed layers, f32.
  DecoderOptions o = testing::host_options(n);
  o.chunk = 3;
  o.resident_layers = 0;
  o.override_dtype = true;
  o.dtype = DType::kF32;
  Decoder d(c, WeightSource{dir, 0}, o);
  // The double-precision reference of the same weights and its float32 bounds
  // (tests/model/reference_forward.hpp), modelling RMSNorm's mean as a float32 sum too, as
  // transformers takes it: both evaluations must lie within them.
  testing::ReferenceModel model(c, dir, DType::kF32);
  model.round_mean_square(true);
  model.prefill_forward(8);  // the forwards below, which dynamic's and longrope's tables follow
  const testing::Bounded exact = model.logits(ids);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  const int first = 8;
  d.prefill(0, std::vector<std::int32_t>(ids.begin(), ids.begin() + first), logits.data());
  double worst = 0, worst_hf = 0;
  const auto check = [&](const float* ours, int pos, const char* who) {
    const testing::BoundCheck b =
        testing::check_within(ours, exact.vr(pos), exact.er(pos), exact.sr(pos), c.vocab_size);
    EXPECT_TRUE(b.within()) << GetParam() << " " << who << " position " << pos << ": logit "
                            << b.worst_index << " off by " << b.worst_error << ", " << b.worst_share
                            << " of its bound; mean (error/sigma)^2 " << b.mean_square();
    return b.worst_share;
  };
  for (int pos = first - 1; pos < n; ++pos) {
    if (pos >= first) d.decode({ids[static_cast<std::size_t>(pos)]}, logits.data());
    worst = std::max(worst, check(logits.data(), pos, "kvoffload"));
    worst_hf = std::max(worst_hf, check(expected + static_cast<std::int64_t>(pos) * c.vocab_size,
                                        pos, "transformers"));
  }
  // The whole prompt in one prefill gives the last position too (in one forward, whose rope
  // table dynamic and longrope choose by its whole length).
  Decoder whole(c, WeightSource{dir, 0}, o);
  whole.prefill(0, ids, logits.data());
  testing::Bounded one_forward;
  if (rope_depends_on_length(c.rope_scaling)) {
    model.prefill_forward(0);
    one_forward = model.logits(ids);
  }
  const testing::Bounded& whole_exact =
      rope_depends_on_length(c.rope_scaling) ? one_forward : exact;
  const testing::BoundCheck b =
      testing::check_within(logits.data(), whole_exact.vr(n - 1), whole_exact.er(n - 1),
                            whole_exact.sr(n - 1), c.vocab_size);
  EXPECT_TRUE(b.within()) << GetParam() << " one prefill: logit " << b.worst_index << " off by "
                          << b.worst_error << ", " << b.worst_share << " of its bound";
  std::printf("%s: worst error %.3g of the float32 bound (transformers: %.3g) over %d positions\n",
              GetParam(), worst, worst_hf, n - first + 1);
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

INSTANTIATE_TEST_SUITE_P(Architectures, HfReference,
                         ::testing::Values("llama31", "mistral", "qwen2", "llama_linear",
                                           "llama_dynamic", "qwen2_yarn", "llama_longrope", "qwen3",
                                           "phi3"));

}  // namespace
}  // namespace kvo::model
