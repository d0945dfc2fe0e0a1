// Choosing the next token from a row of logits: greedy, or temperature with optional top-k and
// top-p (nucleus) filtering, from a seeded generator per slot (a slot's tokens do not depend on
// which other slots decode with it).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace kvo::model {

struct SamplingParams {
  float temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;          // 0: no limit
  float top_p = 1;        // 1: no limit
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, std::uint64_t seed, int slot);
  std::int32_t sample(const float* logits, int vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, std::int32_t>> candidates_;
};

std::int32_t argmax(const float* logits, int vocab);

}  // namespace kvo::model
