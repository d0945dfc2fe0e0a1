#include "offload/attend/attend_keys.hpp"

#include <algorithm>

#include "offload/attend/row_math.hpp"

namespace kvo::attend {

using namespace rows;

KVO_VECTOR_CLONES
void attend_keys(const float* q, int kv_heads, int group, int head_dim, KeyRows k, KeyRows v,
                 int keys, SoftmaxState* state, float* acc, float* kv, float* scores,
                 float softcap) {
  const int d = head_dim;
  const int rows = kv_heads * group;
  const auto elem = static_cast<std::int64_t>(element_bytes(k.type));
  // Keys [j0, j0 + nb) of every head as f32: kv [j][g][d].
  auto convert_block = [&](const KeyRows& from, int j0, int nb) {
    for (int j = 0; j < nb; ++j) {
      for (int g = 0; g < kv_heads; ++g) {
        const std::int64_t at = (j0 + j) * from.token_stride + g * from.head_stride;
        convert_row(static_cast<const char*>(from.base) + at * elem, from.type, d,
                    kv + (static_cast<std::int64_t>(j) * kv_heads + g) * d);
      }
    }
  };
  for (int j0 = 0; j0 < keys; j0 += kKeyBlock) {
    const int nb = std::min(kKeyBlock, keys - j0);
    convert_block(k, j0, nb);
    for (int row = 0; row < rows; ++row) {
      const int g = row / group;
      float* s = scores + row * kKeyBlock;
      for (int j = 0; j < nb; ++j) {
        s[j] = dot(q + static_cast<std::int64_t>(row) * d,
                   kv + (static_cast<std::int64_t>(j) * kv_heads + g) * d, d);
      }
      if (softcap > 0) {
        for (int j = 0; j < nb; ++j) s[j] = soft_cap_value(s[j], softcap);
      }
      const float factor = softmax_block_rescale(state[row], max_of(s, nb));
      if (factor != 1.0f) {
        float* a = acc + static_cast<std::int64_t>(row) * d;
        for (int e = 0; e < d; ++e) a[e] *= factor;
        state[row].sum *= factor;
      }
      for (int j = 0; j < nb; ++j) s[j] -= state[row].max;
      exp_row(s, nb);
      state[row].sum += sum_of(s, nb);
    }
    convert_block(v, j0, nb);
    for (int j = 0; j < nb; ++j) {
      for (int row = 0; row < rows; ++row) {
        const float p = scores[row * kKeyBlock + j];
        const float* vj = kv + (static_cast<std::int64_t>(j) * kv_heads + row / group) * d;
        float* a = acc + static_cast<std::int64_t>(row) * d;
        for (int e = 0; e < d; ++e) a[e] += p * vj[e];
      }
    }
  }
}

}  // namespace kvo::attend
