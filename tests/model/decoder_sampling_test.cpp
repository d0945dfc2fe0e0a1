// Decoder::prefill_sample / decode_sample on the host backend: the same tokens as a Sampler per
// slot fed the logits of prefill / decode, the reference the CUDA sampler is compared against.
#include "model/model_test_util.hpp"

namespace kvo::model {
namespace {

void expect_same_tokens(const SamplingParams& params) {
  ModelConfig c = testing::small_config();
  const int slots = 2;
  const DecoderOptions o = testing::host_options(200, slots);
  Decoder with_logits(c, WeightSource{"", 3}, o);
  Decoder with_draws(c, WeightSource{"", 3}, o);
  with_draws.set_sampling(params, 41);
  std::vector<Sampler> samplers;
  for (int s = 0; s < slots; ++s) samplers.emplace_back(params, 41, s);
  const int vocab = c.vocab_size;
  std::vector<float> logits(static_cast<std::size_t>(slots) * vocab);
  std::vector<std::int32_t> expected(slots), drawn(slots, -1);
  for (int s = 0; s < slots; ++s) {
    const auto prompt = testing::random_prompt(20 + 7 * s, vocab, 2 + s);
    with_logits.prefill(s, prompt, logits.data() + s * vocab);
    expected[s] = samplers[s].sample(logits.data() + s * vocab, vocab);
    drawn[s] = with_draws.prefill_sample(s, prompt);
  }
  EXPECT_EQ(drawn, expected);
  for (int step = 0; step < 12; ++step) {
    with_logits.decode(expected, logits.data());
    with_draws.decode_sample(expected, drawn.data());
    for (int s = 0; s < slots; ++s)
      expected[s] = samplers[s].sample(logits.data() + s * vocab, vocab);
    EXPECT_EQ(drawn, expected) << "step " << step;
  }
}

TEST(DecoderSampling, GreedyEqualsArgmaxOfTheLogits) {
  expect_same_tokens(SamplingParams{});
}
TEST(DecoderSampling, SeededDrawsEqualASamplerPerSlot) {
  expect_same_tokens(SamplingParams{0.8f, 30, 0.9f});
}
TEST(DecoderSampling, RefusesBadParams) {
  Decoder d(testing::small_config(), WeightSource{"", 3}, testing::host_options(50));
  EXPECT_THROW(d.set_sampling(SamplingParams{-1.0f, 0, 1.0f}, 1), std::exception);
  EXPECT_THROW(d.set_sampling(SamplingParams{1.0f, 0, 0.0f}, 1), std::exception);
}

}  // namespace
}  // namespace kvo::model
