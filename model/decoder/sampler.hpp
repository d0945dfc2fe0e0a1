// Choosing the next token from a row of logits: greedy, or temperature with optional top-k and
// top-p (nucleus) filtering. Draw d of slot s is decided by sampling_uniform(seed, s, d)
// (model/decoder/numerics.hpp), a counter-based draw: a slot's tokens do not depend on which other
// slots decode with it, and the device sampler (model/cuda/kernels_sampling.cu) picks the same
// tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace kvo::model {

struct SamplingParams {
  float temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;          // 0: no limit
  float top_p = 1;        // 1: no limit
};

// Throws kvo::Error(kInvalidArgument) unless temperature >= 0, top_k >= 0, 0 < top_p <= 1.
void check_sampling(const SamplingParams& params);

// The rule both samplers follow, for a uniform u in [0, 1): scaled = logits / temperature;
// top-k keeps every candidate >= the k-th largest (ties at the cut are kept); p = exp(scaled -
// max) over those; top-p then keeps every candidate >= the one at which the cumulative p, in
// descending order, first reaches top_p of the total; the token is the first id, in id order, at
// which the running sum of the kept p exceeds u times their total. `scratch` is reused storage.
std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, float u,
                          std::vector<float>& scratch);
// The same with scratch [2 * vocab] given.
std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, float u,
                          float* scratch);

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::uint64_t seed, int slot);
  // Draw number draws() of this slot; counts it.
  std::int32_t sample(const float* logits, int vocab);
  std::uint64_t draws() const { return draws_; }

 private:
  SamplingParams params_;
  std::uint64_t seed_;
  int slot_;
  std::uint64_t draws_ = 0;
  std::vector<float> scratch_;
};

std::int32_t argmax(const float* logits, int vocab);

}  // namespace kvo::model
