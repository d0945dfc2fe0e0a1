#include "model/decoder/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kvoffload/error.hpp"
#include "model/common/numerics.hpp"

namespace kvo::model {

std::int32_t argmax(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

void check_sampling(const SamplingParams& params) {
  if (!(params.temperature >= 0) || params.top_k < 0 || !(params.top_p > 0 && params.top_p <= 1)) {
    throw Error(ErrorCode::kInvalidArgument,
                "sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1");
  }
}

std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, float u,
                          std::vector<float>& scratch) {
  scratch.resize(2 * static_cast<std::size_t>(vocab));
  return sample_token(logits, vocab, params, u, scratch.data());
}

std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& params, float u,
                          float* scratch) {
  if (params.temperature == 0) return argmax(logits, vocab);
  // scratch: scaled [vocab] | sorted [vocab]
  float* scaled = scratch;
  float* sorted = scratch + vocab;
  float top = -INFINITY;
  for (int i = 0; i < vocab; ++i) {
    scaled[i] = logits[i] / params.temperature;
    top = std::max(top, scaled[i]);
  }
  float cut = -INFINITY;  // candidates >= cut are kept
  if (params.top_k > 0 && params.top_k < vocab) {
    std::copy(scaled, scaled + vocab, sorted);
    std::nth_element(sorted, sorted + params.top_k - 1, sorted + vocab, std::greater<float>());
    cut = sorted[params.top_k - 1];
  }
  double total = 0;
  int kept = 0;
  for (int i = 0; i < vocab; ++i) {
    if (scaled[i] < cut) continue;
    total += std::exp(scaled[i] - top);
    sorted[kept++] = scaled[i];
  }
  if (params.top_p < 1) {
    std::sort(sorted, sorted + kept, std::greater<float>());
    const double goal = static_cast<double>(params.top_p) * total;
    double cumulative = 0;
    int i = 0;
    for (; i < kept - 1; ++i) {
      cumulative += std::exp(sorted[i] - top);
      if (cumulative >= goal) break;
    }
    cut = sorted[i];
    total = 0;
    for (int j = 0; j < vocab; ++j) {
      if (scaled[j] >= cut) total += std::exp(scaled[j] - top);
    }
  }
  const double target = static_cast<double>(u) * total;
  double running = 0;
  int last = 0;
  for (int i = 0; i < vocab; ++i) {
    if (scaled[i] < cut) continue;
    running += std::exp(scaled[i] - top);
    last = i;
    if (target < running) return i;
  }
  return last;
}

Sampler::Sampler(const SamplingParams& params, std::uint64_t seed, int slot)
    : params_(params), seed_(seed), slot_(slot) {
  check_sampling(params);
}

std::int32_t Sampler::sample(const float* logits, int vocab) {
  const float u = sampling_uniform(seed_, static_cast<std::uint64_t>(slot_), draws_++);
  return sample_token(logits, vocab, params_, u, scratch_);
}

}  // namespace kvo::model
