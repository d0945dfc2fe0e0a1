#include "model/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "kvoffload/error.hpp"
#include "model/numerics.hpp"

namespace kvo::model {

std::int32_t argmax(const float* logits, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params, std::uint64_t seed, int slot)
    : params_(params), rng_(splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(slot)))) {
  if (!(params.temperature >= 0) || params.top_k < 0 || !(params.top_p > 0 && params.top_p <= 1)) {
    throw Error(ErrorCode::kInvalidArgument,
                "sampling needs temperature >= 0, top_k >= 0 and 0 < top_p <= 1");
  }
}

std::int32_t Sampler::sample(const float* logits, int vocab) {
  if (params_.temperature == 0) return argmax(logits, vocab);
  candidates_.resize(static_cast<std::size_t>(vocab));
  for (int i = 0; i < vocab; ++i) {
    candidates_[static_cast<std::size_t>(i)] = {logits[i] / params_.temperature, i};
  }
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < keep) {
    keep = static_cast<std::size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates, in descending order.
  const float top = candidates_[0].first;
  double sum = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    candidates_[i].first = std::exp(candidates_[i].first - top);
    sum += candidates_[i].first;
  }
  if (params_.top_p < 1) {
    double cumulative = 0;
    std::size_t nucleus = 0;
    while (nucleus < keep) {
      cumulative += candidates_[nucleus].first / sum;
      ++nucleus;
      if (cumulative >= params_.top_p) break;
    }
    keep = nucleus;
    sum = 0;
    for (std::size_t i = 0; i < keep; ++i) sum += candidates_[i].first;
  }
  const double target = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double running = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    running += candidates_[i].first;
    if (target < running) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace kvo::model
