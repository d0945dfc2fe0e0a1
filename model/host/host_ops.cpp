#include "model/host/host_ops.hpp"

#include "model/host/blas.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "kvoffload/error.hpp"
#include "model/host/host_kernels.hpp"

namespace kvo::model {
namespace {

constexpr int kRowBlock = 16;                 // rows per task of the row-wise operations
constexpr std::int64_t kElemBlock = 1 << 14;  // elements per task of the elementwise ones

int blocks_of(std::int64_t count, std::int64_t block) {
  return static_cast<int>((count + block - 1) / block);
}

// The layout in the given workspace, or in `own`, made for the shape.
HostWorkspaceLayout carve(const OpsShape& shape, void* workspace, std::uint64_t bytes,
                          std::unique_ptr<HostRegion>* own) {
  if (workspace == nullptr) {
    bytes = HostWorkspaceLayout(shape).bytes;
    *own = std::make_unique<HostRegion>(bytes);
    workspace = (*own)->data();
  }
  return HostWorkspaceLayout(shape, static_cast<std::byte*>(workspace), bytes);
}

OpsShape with_threads(OpsShape shape) {
  shape.threads = std::max(1, shape.threads);
  return shape;
}

}  // namespace

HostOps::HostOps(const OpsShape& shape, void* workspace, std::uint64_t workspace_bytes)
    : shape_(with_threads(shape)),
      elem_(shape.weight_dtype),
      norm_offset_(shape.config.norm_offset()),
      pool_(shape_.threads),
      layout_(carve(shape_, workspace, workspace_bytes, &own_)),
      linear_(pool_, elem_, shape.f32_gemm, shape.weight_blocks, shape.q8_activations,
              layout_.linear),
      kv_elem_(shape.kv_dtype),
      attention_(shape.config, kv_elem_, pool_, layout_.attention) {
  // Everything else is mapped by now; OpenBLAS maps a buffer in each thread's first GEMM, and
  // retries forever when it cannot.
  blas::check_address_space(pool_.threads(), 0);
}

void HostOps::embed(const std::int32_t* tokens, int n, WeightRef table, float* out) {
  const int h = shape_.config.hidden_size;
  const std::size_t row_bytes = matrix_bytes(table.type, 1, h);
  pool_.run(blocks_of(n, kRowBlock), [&](int b, int) {
    for (int i = b * kRowBlock; i < std::min(n, (b + 1) * kRowBlock); ++i) {
      const void* row = static_cast<const char*>(table.data) + tokens[i] * row_bytes;
      float* dst = out + static_cast<std::int64_t>(i) * h;
      if (table.in_blocks()) {
        kernels::dequantize_rows(table.ggml(), row, 1, h, dst);
      } else {
        kernels::to_f32(row, dtype_of(table.type), h, dst);  // the model dtype, or kept f16/bf16
      }
      if (shape_.embed_scale != 1.0f) {
        for (int e = 0; e < h; ++e) dst[e] *= shape_.embed_scale;
      }
    }
  });
}

void HostOps::rms_norm(const float* x, int n, int width, const void* weight, float* out) {
  const int h = width;
  if (static_cast<std::size_t>(h) > layout_.norm_weight.size()) {
    throw Error(ErrorCode::kInternal, "a norm of " + std::to_string(h) + " elements, wider than " +
                                          std::to_string(layout_.norm_weight.size()));
  }
  kernels::to_f32(weight, elem_, h, layout_.norm_weight.data());
  if (const float offset = norm_offset_; offset != 0) {
    for (int i = 0; i < h; ++i) layout_.norm_weight[static_cast<std::size_t>(i)] += offset;
  }
  pool_.run(blocks_of(n, kRowBlock), [&](int b, int) {
    const int t0 = b * kRowBlock;
    const std::int64_t at = static_cast<std::int64_t>(t0) * h;
    kernels::rms_norm_rows(x + at, std::min(kRowBlock, n - t0), h, layout_.norm_weight.data(),
                           static_cast<float>(shape_.config.rms_norm_eps), out + at);
  });
}

void HostOps::linear(const float* x, int n, int in, WeightRef w, const void* bias, int out,
                     float* y, bool accumulate) {
  linear_(x, n, in, w, bias, out, y, accumulate);
}

// The rotation of rope_rotate, with each position's angles computed once for all its heads.
void HostOps::rope(float* q, float* k, int n, const std::int32_t* positions, int first_position,
                   bool local) {
  const ModelConfig& c = shape_.config;
  const int d = c.head_dim;
  const int half = d / 2;
  const float* inv_freq = local ? shape_.inv_freq_local : shape_.inv_freq;
  const float scale = local ? 1.0f : shape_.rope_scale;
  pool_.run(blocks_of(n, kRowBlock), [&](int b, int thread) {
    float* cos_sin = layout_.rope_angles[static_cast<std::size_t>(thread)].data();
    for (int i = b * kRowBlock; i < std::min(n, (b + 1) * kRowBlock); ++i) {
      const int pos = positions != nullptr ? positions[i] : first_position + i;
      for (int e = 0; e < half; ++e) {
        const float angle = static_cast<float>(pos) * inv_freq[e];
        cos_sin[e] = cosf(angle) * scale;
        cos_sin[half + e] = sinf(angle) * scale;
      }
      auto rotate = [&](float* x) {
        for (int e = 0; e < half; ++e) {
          const float a = x[e];
          const float bb = x[e + half];
          x[e] = a * cos_sin[e] - bb * cos_sin[half + e];
          x[e + half] = bb * cos_sin[e] + a * cos_sin[half + e];
        }
      };
      for (int h = 0; h < c.heads; ++h)
        rotate(q + (static_cast<std::int64_t>(i) * c.heads + h) * d);
      for (int h = 0; h < c.kv_heads; ++h) {
        rotate(k + (static_cast<std::int64_t>(i) * c.kv_heads + h) * d);
      }
    }
  });
}

void HostOps::to_cache_rows(const float* x, int n, void* out) {
  const ModelConfig& c = shape_.config;
  const std::int64_t row = static_cast<std::int64_t>(c.kv_heads) * c.head_dim;
  if (is_quantized(shape_.kv_dtype)) {
    // The arithmetic of the CUDA path's quantize_rows kernel, row by row.
    const auto row_bytes = static_cast<std::int64_t>(quant_row_bytes(c.kv_heads, c.head_dim));
    pool_.run(n, [&](int i, int) {
      quantize_row(x + i * row, c.kv_heads, c.head_dim, shape_.kv_dtype,
                   static_cast<char*>(out) + i * row_bytes);
    });
    return;
  }
  const std::int64_t count = n * row;
  const auto bytes = static_cast<std::int64_t>(dtype_size(shape_.kv_dtype));
  pool_.run(blocks_of(count, kElemBlock), [&](int b, int) {
    const std::int64_t at = b * kElemBlock;
    kernels::from_f32(x + at, std::min(kElemBlock, count - at), kv_elem_,
                      static_cast<char*>(out) + at * bytes);
  });
}

void HostOps::attention_prefill(const float* q, int n, int slot, int first_position, int window,
                                const LayerView& view, float* out) {
  attention_.prefill(q, n, slot, first_position, window, view, out);
}

void HostOps::attention_decode(const float* q, int n, const DecodeRows& rows, int window,
                               const LayerView& view, float* out) {
  attention_.decode(q, n, rows.host_slots, rows.host_positions, window, view, out);
}

void HostOps::attention_decode_split(const float* q, int n, const DecodeRows& rows, int window,
                                     const LayerView& view, float* out) {
  const int heads = shape_.config.heads;
  const int d = shape_.config.head_dim;
  const auto rows_heads = static_cast<std::size_t>(n) * heads;
  host_out_.resize(rows_heads * d);
  lse_.resize(rows_heads);
  host_lse_.resize(rows_heads);
  // The view's rows from the split on, then the host store's before it: each part normalized,
  // with its log-sum-exp.
  HostAttention::KeyRange tail;
  tail.begin = view.split_rows;
  tail.lse = lse_.data();
  attention_.decode(q, n, rows.host_slots, rows.host_positions, window, view, out, tail);
  HostAttention::KeyRange head;
  head.end = view.split_rows;
  head.lse = host_lse_.data();
  attention_.decode(q, n, rows.host_slots, rows.host_positions, window, host_part(view),
                    host_out_.data(), head);
  pool_.run(n, [&](int i, int) {
    for (int h = 0; h < heads; ++h) {
      const std::size_t rh = static_cast<std::size_t>(i) * heads + h;
      const LseMerge m = lse_merge(lse_[rh], host_lse_[rh]);
      float* dst = out + rh * d;
      const float* part = host_out_.data() + rh * d;
      for (int e = 0; e < d; ++e) dst[e] = dst[e] * m.keep + part[e] * m.take;
    }
  });
}

void HostOps::gated_activation(float* gate, const float* up, std::int64_t count) {
  const bool gelu = shape_.config.hidden_act == Activation::kGeluTanh;
  pool_.run(blocks_of(count, kElemBlock), [&](int b, int) {
    const std::int64_t at = b * kElemBlock;
    const std::int64_t m = std::min(kElemBlock, count - at);
    if (gelu) {
      kernels::geglu_tanh(gate + at, up + at, m);
    } else {
      kernels::swiglu(gate + at, up + at, m);
    }
  });
}

void HostOps::add(float* x, const float* y, std::int64_t count, float scale) {
  pool_.run(blocks_of(count, kElemBlock), [&](int b, int) {
    const std::int64_t at = b * kElemBlock;
    kernels::add(x + at, y + at, std::min(kElemBlock, count - at), scale);
  });
}

void HostOps::scale(float* x, std::int64_t count, float factor) {
  pool_.run(blocks_of(count, kElemBlock), [&](int b, int) {
    const std::int64_t at = b * kElemBlock;
    kernels::scale(x + at, std::min(kElemBlock, count - at), factor);
  });
}

void HostOps::soft_cap(float* x, std::int64_t count, float cap) {
  pool_.run(blocks_of(count, kElemBlock), [&](int b, int) {
    const std::int64_t at = b * kElemBlock;
    kernels::soft_cap(x + at, std::min(kElemBlock, count - at), cap);
  });
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
                             layout_.sample.data());
  }
}

}  // namespace kvo::model
