// Shared helpers of the model tests: small shapes, greedy runs on the host backend, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/checkpoint/ggml_blocks.hpp"
#include "model/common/numerics.hpp"
#include "model/decoder/decoder.hpp"
#include "model/decoder/sampler.hpp"

namespace kvo::model::testing {

// A random matrix [out][in] in blocks of `type`: random bytes, with every f16 in a block's scale
// fields drawn in [2^-10, 2^-6) with a sign (finite scales).
inline std::vector<std::uint8_t> random_block_matrix(std::uint32_t type, int out, int in,
                                                     std::mt19937& rng) {
  const int block_bytes = blocks::block_bytes(type);
  const int row_blocks = in / blocks::block_elements(type);
  std::vector<std::uint8_t> w(static_cast<std::size_t>(out * row_blocks * block_bytes));
  for (auto& byte : w) byte = static_cast<std::uint8_t>(rng());
  const int d_at = type == blocks::kQ6_K ? 208 : 0;
  const int scales =
      type == blocks::kQ4_K || type == blocks::kQ5_K || type == blocks::kQ4_1 ? 2 : 1;
  for (int b = 0; b < out * row_blocks; ++b) {
    for (int k = 0; k < scales; ++k) {
      const std::uint16_t h = static_cast<std::uint16_t>(((rng() & 1) << 15) |
                                                         ((5 + rng() % 4) << 10) | (rng() & 0x3ff));
      std::memcpy(&w[static_cast<std::size_t>(b * block_bytes + d_at + 2 * k)], &h, 2);
    }
  }
  return w;
}

// A Llama-3.1-like shape small enough to run many times per test.
inline ModelConfig small_config() {
  ModelConfig c = preset("tiny");
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 144;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.rope_scaling.original_max_position = 64;
  c.tie_word_embeddings = false;
  c.dtype = DType::kF32;
  return c;
}

inline DecoderOptions host_options(int max_seq, int slots = 1) {
  DecoderOptions o;
  o.backend = BackendKind::kHost;
  o.max_seq = max_seq;
  o.slots = slots;
  o.chunk = 16;
  return o;
}

inline std::vector<std::int32_t> random_prompt(int n, int vocab, std::uint64_t seed) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ids[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(splitmix64(seed * 7919 + static_cast<std::uint64_t>(i)) %
                                  static_cast<std::uint64_t>(vocab));
  }
  return ids;
}

// Prefill then greedy decode of `steps` tokens in `slot`, the other slots idle; returns every
// logits row in order.
struct GreedyRun {
  std::vector<std::int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

inline GreedyRun greedy(Decoder& d, const std::vector<std::int32_t>& prompt, int steps,
                        int slot = 0) {
  const int vocab = d.config().vocab_size;
  const int slots = d.options().slots;
  GreedyRun run;
  std::vector<float> logits(static_cast<std::size_t>(vocab) * slots);
  d.prefill(slot, prompt, logits.data() + static_cast<std::size_t>(slot) * vocab);
  for (int i = 0; i < steps; ++i) {
    const float* row = logits.data() + static_cast<std::size_t>(slot) * vocab;
    run.logits.emplace_back(row, row + vocab);
    run.tokens.push_back(argmax(row, vocab));
    if (i + 1 == steps) break;
    std::vector<std::int32_t> next(static_cast<std::size_t>(slots), -1);
    next[static_cast<std::size_t>(slot)] = run.tokens.back();
    d.decode(next, logits.data());
  }
  return run;
}

// max |a - b| / max |b|
inline double relative_error(const float* a, const float* b, std::size_t n) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace kvo::model::testing
