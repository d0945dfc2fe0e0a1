#include "model/host_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvo::model {
namespace {

// Eight independent partial sums: vectorizes, and the order depends only on `n`, so a row's
// result never depends on which other rows share the call.
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Elements [index, index + count) of `base` as f32; returns `base` itself when it is f32.
inline const float* as_f32(const void* base, std::int64_t index, int count, Elem type,
                           float* scratch) {
  if (type == Elem::kF32) return static_cast<const float*>(base) + index;
  for (int i = 0; i < count; ++i) scratch[i] = load_elem(base, index + i, type);
  return scratch;
}

constexpr int kTokenBlock = 32;

}  // namespace

HostOps::HostOps(const OpsShape& shape)
    : shape_(shape), elem_(static_cast<Elem>(static_cast<int>(shape.weight_dtype))) {
  const ModelConfig& c = shape_.config;
  const int widest =
      std::max({c.hidden_size, c.intermediate_size, static_cast<int>(c.q_dim()), c.vocab_size});
  row_.resize(static_cast<std::size_t>(widest) + 2 * static_cast<std::size_t>(c.head_dim));
  scores_.resize(static_cast<std::size_t>(c.heads / c.kv_heads) *
                 static_cast<std::size_t>(shape_.max_seq));
}

void HostOps::embed(const std::int32_t* tokens, int n, const void* table, float* out) {
  const int h = shape_.config.hidden_size;
  for (int i = 0; i < n; ++i) {
    const std::int64_t base = static_cast<std::int64_t>(tokens[i]) * h;
    for (int j = 0; j < h; ++j) {
      out[static_cast<std::int64_t>(i) * h + j] = load_elem(table, base + j, elem_);
    }
  }
}

void HostOps::rms_norm(const float* x, int n, const void* weight, float* out) {
  const int h = shape_.config.hidden_size;
  const float* w = as_f32(weight, 0, h, elem_, row_.data());
  for (int i = 0; i < n; ++i) {
    const float* xi = x + static_cast<std::int64_t>(i) * h;
    double sum = 0;
    for (int j = 0; j < h; ++j) sum += static_cast<double>(xi[j]) * xi[j];
    const float scale = static_cast<float>(
        1.0 / std::sqrt(sum / h + static_cast<double>(shape_.config.rms_norm_eps)));
    float* oi = out + static_cast<std::int64_t>(i) * h;
    for (int j = 0; j < h; ++j) oi[j] = w[j] * (xi[j] * scale);
  }
}

void HostOps::linear(const float* x, int n, int in, const void* w, const void* bias, int out,
                     float* y, bool accumulate) {
  for (int t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int t1 = std::min(n, t0 + kTokenBlock);
    for (int o = 0; o < out; ++o) {
      const float* wo = as_f32(w, static_cast<std::int64_t>(o) * in, in, elem_, row_.data());
      const float b = bias != nullptr ? load_elem(bias, o, elem_) : 0.0f;
      for (int t = t0; t < t1; ++t) {
        const float value = dot(x + static_cast<std::int64_t>(t) * in, wo, in) + b;
        float& dst = y[static_cast<std::int64_t>(t) * out + o];
        dst = accumulate ? dst + value : value;
      }
    }
  }
}

void HostOps::rope(float* q, float* k, int n, const std::int32_t* positions, int first_position) {
  const ModelConfig& c = shape_.config;
  const int d = c.head_dim;
  for (int i = 0; i < n; ++i) {
    const int pos = positions != nullptr ? positions[i] : first_position + i;
    for (int h = 0; h < c.heads; ++h) {
      rope_rotate(q + (static_cast<std::int64_t>(i) * c.heads + h) * d, d, shape_.inv_freq, pos);
    }
    for (int h = 0; h < c.kv_heads; ++h) {
      rope_rotate(k + (static_cast<std::int64_t>(i) * c.kv_heads + h) * d, d, shape_.inv_freq, pos);
    }
  }
}

void HostOps::to_cache_rows(const float* x, std::int64_t count, void* out) {
  for (std::int64_t i = 0; i < count; ++i) store_elem(out, i, elem_, x[i]);
}

void HostOps::attend(const float* q, int slot, int first, int last, const LayerView& view,
                     float* out) {
  const ModelConfig& c = shape_.config;
  const int d = c.head_dim;
  const int group = c.heads / c.kv_heads;
  const int keys = last - first + 1;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  float* tmp = row_.data();
  for (int g = 0; g < c.kv_heads; ++g) {
    // scores [group][keys]
    for (int j = 0; j < keys; ++j) {
      const std::int64_t at = slot * view.slot_stride +
                              static_cast<std::int64_t>(first + j) * view.token_stride +
                              g * view.head_stride;
      const float* kj = as_f32(view.k, at, d, elem_, tmp);
      for (int r = 0; r < group; ++r) {
        const float* qh = q + static_cast<std::int64_t>(g * group + r) * d;
        scores_[static_cast<std::size_t>(r) * shape_.max_seq + j] = dot(qh, kj, d) * scale;
      }
    }
    for (int r = 0; r < group; ++r) {
      float* s = scores_.data() + static_cast<std::size_t>(r) * shape_.max_seq;
      float m = -INFINITY;
      for (int j = 0; j < keys; ++j) m = std::max(m, s[j]);
      float sum = 0;
      for (int j = 0; j < keys; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      const float inv = 1.0f / sum;
      for (int j = 0; j < keys; ++j) s[j] *= inv;
      std::fill(out + static_cast<std::int64_t>(g * group + r) * d,
                out + static_cast<std::int64_t>(g * group + r + 1) * d, 0.0f);
    }
    for (int j = 0; j < keys; ++j) {
      const std::int64_t at = slot * view.slot_stride +
                              static_cast<std::int64_t>(first + j) * view.token_stride +
                              g * view.head_stride;
      const float* vj = as_f32(view.v, at, d, elem_, tmp);
      for (int r = 0; r < group; ++r) {
        const float p = scores_[static_cast<std::size_t>(r) * shape_.max_seq + j];
        float* oh = out + static_cast<std::int64_t>(g * group + r) * d;
        for (int e = 0; e < d; ++e) oh[e] += p * vj[e];
      }
    }
  }
}

void HostOps::attention_prefill(const float* q, int n, int slot, int first_position,
                                const LayerView& view, float* out) {
  const std::int64_t row = shape_.config.q_dim();
  for (int i = 0; i < n; ++i) {
    const int pos = first_position + i;
    attend(q + i * row, slot, first_key(shape_.config, pos), pos, view, out + i * row);
  }
}

void HostOps::attention_decode(const float* q, int n, const DecodeRows& rows, const LayerView& view,
                               float* out) {
  const std::int64_t row = shape_.config.q_dim();
  for (int i = 0; i < n; ++i) {
    const int pos = rows.host_positions[i];
    attend(q + i * row, rows.host_slots[i], first_key(shape_.config, pos), pos, view,
           out + i * row);
  }
}

void HostOps::swiglu(float* gate, const float* up, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void HostOps::fill_synthetic(const WeightLayout& layout, const WeightEntry& entry,
                             std::uint64_t seed, void* dst) {
  model::fill_synthetic(layout, entry, seed, dst);
}

void HostOps::sample(const float* logits, int n, const SampleRows& rows,
                     const SamplingParams& params, std::uint64_t seed, std::int32_t* tokens) {
  const int vocab = shape_.config.vocab_size;
  for (int i = 0; i < n; ++i) {
    const float u = sampling_uniform(seed, static_cast<std::uint64_t>(rows.slots[i]),
                                     static_cast<std::uint32_t>(rows.draws[i]));
    tokens[i] = sample_token(logits + static_cast<std::int64_t>(i) * vocab, vocab, params, u,
                             sample_scratch_);
  }
}

}  // namespace kvo::model
