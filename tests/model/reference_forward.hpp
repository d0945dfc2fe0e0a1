// The decoder's forward pass in double precision, and how far a float32 evaluation of it may lie
// from it: the tolerance of the model tests, derived from float32's rounding rather than tuned to
// what a run measured.
//
// The reference is the same function the decoder computes (the same float32 weights, the same
// float32 rotary angles), evaluated in double: exact, for the purposes here, with exact K/V.
//
// Its float32 error is measured by Monte Carlo arithmetic (Parker, "Monte Carlo Arithmetic",
// 1997; the model of Higham and Mary's probabilistic error analysis, 2019): the same forward
// is run kSamples more times with every float32 rounding replaced by a random relative error
// in [-u, u], u = 2^-24 (every product, every addition of every sum in sequential order, every
// conversion to float; [-2u, 2u] for the host path's exp, a Cephes polynomial to 2 ulp). The
// spread of those runs around the exact one estimates the standard deviation sigma of a float32
// run's error, logit by logit, whatever its summation order (a blocked or pairwise sum, as BLAS
// kernels take, rounds smaller partial sums than the sequential one modelled) and its kernels
// (FMA rounds less). A float32 logit must then lie within
//   kSigmas * sigma + 4 u |logit|
// of the reference. Why worst-case bounds are not used: they add |W| e over every input of every
// layer and grow to 10^11 times the logits here, which would accept anything. With 16 samples
// the estimate is below half of sigma with probability 3e-4 (chi-square, 16 degrees of
// freedom), and a Gaussian error passes 12 sigma with probability 4e-33, 6 with 2e-9: a test
// over 10^4 logits fails by chance about once in 10^6 runs.
//
// K/V stored in fewer bits (bf16, f16, int8, fp8) enter the same way: each sample adds their
// storage error as random noise (see store()), so the bound covers what the format loses too;
// and so do the activations that the host path's AVX512_BF16 GEMMs round to bf16 (bf16 weights
// on a CPU that has it, model/host/host_gemm_bf16.hpp): each input of each product, in every
// projection (decode rows, which a GEMM does not multiply, are bounded more loosely for it).
//
// A run that follows another token path (a near tie the rounding decides) is compared with the
// reference on its own tokens; a token the reference makes certain (its logit beyond every other
// by both bounds) must be the run's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/common/numerics.hpp"
#include "model/common/rope.hpp"
#include "model/decoder/decoder.hpp"
#include "model/host/host_linear.hpp"
#include "rounding.hpp"

namespace kvo::model::testing {

constexpr int kSamples = 16;
constexpr double kSigmas = 12;

// Values with their bounds and the estimated standard deviations of a float32 run's error,
// row-major [rows][width].
struct Bounded {
  std::vector<double> v, e, sigma;
  int width = 0;
  int rows() const { return width == 0 ? 0 : static_cast<int>(v.size() / width); }
  const double* vr(int r) const { return v.data() + static_cast<std::size_t>(r) * width; }
  const double* er(int r) const { return e.data() + static_cast<std::size_t>(r) * width; }
  const double* sr(int r) const { return sigma.data() + static_cast<std::size_t>(r) * width; }
};

// How the K/V rows are stored.
struct KvStorage {
  DType dtype = DType::kF32;
};

// A float32 rounding: exact (the reference), or a random relative error of at most `units` u.
class Rounding {
 public:
  explicit Rounding(std::uint64_t seed) : state_(splitmix64(seed) | 1), random_(seed != 0) {}
  double operator()(double x, double units = 1) {
    if (!random_) return x;
    return x * (1 + units * kU * uniform());
  }
  bool random() const { return random_; }
  // Uniform in [-1, 1).
  double uniform() {
    state_ ^= state_ << 13;  // xorshift64: cheap, and plenty for a rounding model
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return static_cast<double>(static_cast<std::int64_t>(state_)) * 0x1p-63;
  }

 private:
  std::uint64_t state_;
  bool random_;
};

class ReferenceModel {
 public:
  // The decoder's synthetic weights for `seed` in `dtype` (by default the model's).
  ReferenceModel(const ModelConfig& c, std::uint64_t seed, DType dtype) : c_(c), layout_(c, dtype) {
    region_.resize(layout_.bytes());
    for (const WeightEntry& e : layout_.entries()) {
      fill_synthetic(layout_, e, seed, region_.data() + e.offset);
    }
    w_ = layout_.bind(region_.data());
    round_inputs_to_bf16(uses_bf16_gemm(layout_.dtype(), false));
  }
  ReferenceModel(const ModelConfig& c, std::uint64_t seed) : ReferenceModel(c, seed, c.dtype) {}
  // A checkpoint's weights, converted to `dtype` as the decoder converts them.
  ReferenceModel(const ModelConfig& c, const std::string& checkpoint_dir, DType dtype)
      : c_(c), layout_(c, dtype) {
    region_.resize(layout_.bytes());
    const Checkpoint checkpoint(checkpoint_dir);
    load_checkpoint(layout_, checkpoint, [&](std::size_t offset, const void* host, std::size_t n) {
      std::memcpy(region_.data() + offset, host, n);
    });
    w_ = layout_.bind(region_.data());
    round_inputs_to_bf16(uses_bf16_gemm(layout_.dtype(), false));
  }

  // Whether the projections' inputs are rounded to bf16 (half a step, 2^-8 relative, as noise);
  // by default as the host path's GEMMs do for these weights on this CPU.
  void round_inputs_to_bf16(bool yes) { bf16_inputs_ = yes; }

  // Also model the mean of squares of RMSNorm as a float32 sum (transformers takes it so; the
  // host path in double, with less error): for a bound that covers both.
  void round_mean_square(bool yes) { float_mean_square_ = yes; }
  // The decoder's forwards, which the rope table of dynamic and longrope follows (rope.hpp): the
  // first `positions` in one forward, then one position a forward. 0 (the default): all in one.
  void prefill_forward(int positions) { prefill_ = positions; }

  const ModelConfig& config() const { return c_; }

  // Logits of every position of `tokens`, [tokens][vocab] (prefill_scored's rows; the last is
  // what prefill and decode give for the last token), and the bound of each.
  Bounded logits(const std::vector<std::int32_t>& tokens, KvStorage kv = {}) const {
    Bounded out;
    out.width = c_.vocab_size;
    Rounding exact(0);
    out.v = forward(tokens, kv, exact);
    std::vector<double> spread(out.v.size(), 0);
    for (int s = 1; s <= kSamples; ++s) {
      Rounding random(0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(s));
      const std::vector<double> sample = forward(tokens, kv, random);
      for (std::size_t i = 0; i < spread.size(); ++i) {
        spread[i] += (sample[i] - out.v[i]) * (sample[i] - out.v[i]);
      }
    }
    out.e.resize(out.v.size());
    out.sigma.resize(out.v.size());
    for (std::size_t i = 0; i < spread.size(); ++i) {
      out.sigma[i] = std::sqrt(spread[i] / kSamples) + kU * std::fabs(out.v[i]);
      out.e[i] = kSigmas * out.sigma[i] + 4 * kU * std::fabs(out.v[i]);
    }
    return out;
  }

 private:
  using Rows = std::vector<double>;  // [rows][width]

  const void* rows_of(const void* fused, std::int64_t first, int in) const {
    return static_cast<const std::byte*>(fused) + static_cast<std::size_t>(first) *
                                                      static_cast<std::size_t>(in) *
                                                      dtype_size(layout_.dtype());
  }

  double weight(const void* base, std::int64_t i) const {
    return load_elem(base, i, layout_.dtype());
  }

  std::vector<double> forward(const std::vector<std::int32_t>& tokens, KvStorage kv,
                              Rounding& r) const {
    const int n = static_cast<int>(tokens.size());
    const int h = c_.hidden_size;
    Rows x(static_cast<std::size_t>(n) * h);
    const double embed_scale = embedding_scale(c_, layout_.dtype());
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < h; ++i) {
        x[t * h + i] = weight(w_.embed.data, std::int64_t{tokens[t]} * h + i);
        if (embed_scale != 1) x[t * h + i] = r(x[t * h + i] * embed_scale);
      }
    }
    const int qd = static_cast<int>(c_.q_dim());
    const int kvd = static_cast<int>(c_.kv_dim());
    for (int layer = 0; layer < c_.layers; ++layer) {
      const LayerWeights& w = w_.layers[static_cast<std::size_t>(layer)];
      // OLMo 2 norms no input: its branches are normed after.
      const Rows xn = w.attn_norm != nullptr ? rms_norm(x, n, w.attn_norm, r) : x;
      // Phi-3's fused q, k, v (and gate, up): each part the rows at an offset of the tensor.
      const void* wk = w.wk.data != nullptr ? w.wk.data : rows_of(w.wq.data, qd, h);
      const void* wv = w.wv.data != nullptr ? w.wv.data : rows_of(w.wq.data, qd + kvd, h);
      Rows q = linear(xn, n, h, w.wq.data, w.bq, qd, nullptr, r);
      Rows k = linear(xn, n, h, wk, w.bk, kvd, nullptr, r);
      Rows v = linear(xn, n, h, wv, w.bv, kvd, nullptr, r);
      if (w.q_norm != nullptr && c_.model_type == "olmo2") {  // over the whole projection
        q = rms_norm(q, n, w.q_norm, r, qd);
        k = rms_norm(k, n, w.k_norm, r, kvd);
      } else if (w.q_norm != nullptr) {  // Qwen3: each head normed before the rotation
        q = rms_norm(q, n * c_.heads, w.q_norm, r, c_.head_dim);
        k = rms_norm(k, n * c_.kv_heads, w.k_norm, r, c_.head_dim);
      }
      const bool local = c_.local_rope(layer);
      rope(q, n, c_.heads, local, r);
      rope(k, n, c_.kv_heads, local, r);
      store(k, n, kv.dtype, r);
      store(v, n, kv.dtype, r);
      const Rows attended = attention(q, k, v, n, c_.window(layer), r);
      if (w.attn_post_norm != nullptr) {  // Gemma: the branch normed before it joins
        add(x,
            rms_norm(linear(attended, n, qd, w.wo.data, w.bo, h, nullptr, r), n, w.attn_post_norm,
                     r),
            r);
      } else if (c_.residual_multiplier != 1) {  // Granite: the branch scaled as it joins
        add(x, linear(attended, n, qd, w.wo.data, w.bo, h, nullptr, r), r, c_.residual_multiplier);
      } else {
        x = linear(attended, n, qd, w.wo.data, w.bo, h, &x, r);
      }
      const Rows xm = w.mlp_norm != nullptr ? rms_norm(x, n, w.mlp_norm, r) : x;
      Rows gate = linear(xm, n, h, w.w_gate.data, nullptr, c_.intermediate_size, nullptr, r);
      const void* w_up =
          w.w_up.data != nullptr ? w.w_up.data : rows_of(w.w_gate.data, c_.intermediate_size, h);
      const Rows up = linear(xm, n, h, w_up, nullptr, c_.intermediate_size, nullptr, r);
      for (std::size_t i = 0; i < gate.size(); ++i) {
        const double g = gate[i];
        if (c_.hidden_act == Activation::kGeluTanh) {
          // 0.5 g (1 + tanh(beta (g + 0.044715 g^3))), each operation rounded.
          const double cube = r(r(r(0.044715f * g) * g) * g);
          const double inner = r(static_cast<double>(0.7978845608028654f) * r(g + cube));
          gate[i] = r(r(r(0.5 * g) * r(1 + r(std::tanh(inner), 2))) * up[i]);
        } else {
          const double denominator = r(1 + r(std::exp(-g), 2));
          gate[i] = r(r(g / denominator) * up[i]);
        }
      }
      if (w.mlp_post_norm != nullptr) {
        add(x,
            rms_norm(linear(gate, n, c_.intermediate_size, w.w_down.data, nullptr, h, nullptr, r),
                     n, w.mlp_post_norm, r),
            r);
      } else if (c_.residual_multiplier != 1) {
        add(x, linear(gate, n, c_.intermediate_size, w.w_down.data, nullptr, h, nullptr, r), r,
            c_.residual_multiplier);
      } else {
        x = linear(gate, n, c_.intermediate_size, w.w_down.data, nullptr, h, &x, r);
      }
    }
    Rows logits = linear(rms_norm(x, n, w_.final_norm, r), n, h, w_.lm_head.data, nullptr,
                         c_.vocab_size, nullptr, r);
    if (c_.final_softcap > 0) {
      for (double& l : logits) l = soft_cap(l, static_cast<float>(c_.final_softcap), r);
    }
    if (c_.logits_scaling != 1) {  // Granite: divided, in float32
      for (double& l : logits) l = r(l / static_cast<float>(c_.logits_scaling));
    }
    return logits;
  }

  // cap tanh(x / cap), each operation rounded (tanh to 2 ulp, as exp).
  static double soft_cap(double x, double cap, Rounding& r) {
    return r(r(std::tanh(r(x / cap)), 2) * cap);
  }

  // x += y * scale, the product rounded to float first.
  static void add(Rows& x, const Rows& y, Rounding& r, double scale = 1) {
    const auto s = static_cast<double>(static_cast<float>(scale));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = r(x[i] + (s == 1 ? y[i] : r(y[i] * s)));
  }

  // y [n][out] = x W^T + bias, added to *residual when given (the GEMM accumulates into it).
  Rows linear(const Rows& x, int n, int in, const void* w, const void* bias, int out,
              const Rows* residual, Rounding& r) const {
    Rows y(static_cast<std::size_t>(n) * out);
    std::vector<double> xt(static_cast<std::size_t>(in));  // row t as the products take it
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < in; ++i) {
        xt[i] = x[t * in + i];
        if (bf16_inputs_ && r.random()) xt[i] += std::ldexp(std::fabs(xt[i]), -8) * r.uniform();
      }
      for (int o = 0; o < out; ++o) {
        double sum = residual != nullptr ? (*residual)[t * out + o] : 0;
        if (bias != nullptr) sum = r(sum + weight(bias, o));
        for (int i = 0; i < in; ++i) {
          sum = r(sum + r(xt[i] * weight(w, std::int64_t{o} * in + i)));
        }
        y[t * out + o] = sum;
      }
    }
    return y;
  }

  // The mean of squares in double (as the host path takes it), its inverse root rounded to float.
  // Rows of `width` (0: hidden_size).
  Rows rms_norm(const Rows& x, int n, const void* w, Rounding& r, int width = 0) const {
    const int h = width > 0 ? width : c_.hidden_size;
    Rows y(x.size());
    for (int t = 0; t < n; ++t) {
      double ms = 0;
      for (int i = 0; i < h; ++i) {
        const double square = x[t * h + i] * x[t * h + i];
        ms = float_mean_square_ ? r(ms + r(square)) : ms + square;
      }
      const double scale =
          r(1 / std::sqrt(ms / h + static_cast<double>(static_cast<float>(c_.rms_norm_eps))));
      for (int i = 0; i < h; ++i) {
        // Gemma's (1 + w), in float32 as transformers takes it.
        const double wi = c_.norm_offset() != 0
                              ? r(weight(w, i) + static_cast<double>(c_.norm_offset()))
                              : weight(w, i);
        y[t * h + i] = r(wi * r(x[t * h + i] * scale));
      }
    }
    return y;
  }

  // The rope table of each position, forward by forward as the decoder follows it.
  std::vector<RopeTable> rope_tables(int n) const {
    RopeSchedule schedule = rope_schedule(c_);
    const int first = prefill_ > 0 ? std::min(prefill_, n) : n;
    schedule.update(first);
    std::vector<RopeTable> tables(static_cast<std::size_t>(n), schedule.table());
    for (int p = first; p < n; ++p) {
      schedule.update(p + 1);
      tables[static_cast<std::size_t>(p)] = schedule.table();
    }
    return tables;
  }

  // Row t at position t; the angle is the float32 product the host path and the kernels take,
  // cos and sin then scaled (yarn, longrope) in float32.
  // `local`: the window layers' table (Gemma 3: the default rope at rope_local_theta).
  void rope(Rows& x, int n, int heads, bool local, Rounding& r) const {
    const int d = c_.head_dim;
    const int half = d / 2;
    const std::vector<RopeTable> tables = rope_tables(n);
    const RopeTable local_table = rope_table(RopeScaling{}, static_cast<float>(c_.rope_local_theta),
                                             d, c_.max_position_embeddings, 1);
    for (int t = 0; t < n; ++t) {
      const RopeTable& table = local ? local_table : tables[static_cast<std::size_t>(t)];
      for (int head = 0; head < heads; ++head) {
        double* v = x.data() + (static_cast<std::size_t>(t) * heads + head) * d;
        for (int i = 0; i < half; ++i) {
          const float angle = static_cast<float>(t) * table.inv_freq[static_cast<std::size_t>(i)];
          double cs = r(std::cos(static_cast<double>(angle)));
          double sn = r(std::sin(static_cast<double>(angle)));
          if (table.scale != 1.0f) {
            cs = r(cs * table.scale);
            sn = r(sn * table.scale);
          }
          const double a = v[i], b = v[i + half];
          v[i] = r(r(a * cs) - r(b * sn));
          v[i + half] = r(r(b * cs) + r(a * sn));
        }
      }
    }
  }

  // The rows as the cache holds them. The reference keeps them exact; a sample adds the format's
  // storage error as a random one (the classic model of quantization noise): within half a step
  // of bf16 (2^-8 relative) or f16 (2^-11), of int8's step (the row's per-head max / 127), or
  // of fp8 e4m3's (2^-4 relative, and 2^-10 of the scale below its normals, where the step is
  // fixed). Modelled as noise rather than reproduced, so that the bound does not hang on whether
  // a value the two evaluations round differently sits next to a step.
  void store(Rows& x, int n, DType dtype, Rounding& r) const {
    if (!r.random() || dtype == DType::kF32) return;
    const int d = c_.head_dim;
    for (int t = 0; t < n; ++t) {
      for (int head = 0; head < c_.kv_heads; ++head) {
        double* v = x.data() + (static_cast<std::size_t>(t) * c_.kv_heads + head) * d;
        double amax = 0;
        for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(v[i]));
        for (int i = 0; i < d; ++i) {
          double half_step = 0;
          switch (dtype) {
            case DType::kBF16:
              half_step = std::ldexp(std::fabs(v[i]), -8);
              break;
            case DType::kF16:
              half_step = std::ldexp(std::fabs(v[i]), -11);
              break;
            case DType::kInt8:
              half_step = amax / 127 / 2;
              break;
            case DType::kFP8E4M3:
              half_step = std::max(std::ldexp(std::fabs(v[i]), -4), amax / 448 * 0x1p-10);
              break;
            default:
              break;
          }
          v[i] += half_step * r.uniform();
        }
      }
    }
  }

  // Over the last `window` keys (0: all), scores scaled and soft-capped as the config says.
  Rows attention(const Rows& q, const Rows& k, const Rows& v, int n, int window,
                 Rounding& r) const {
    const int d = c_.head_dim;
    const int group = c_.heads / c_.kv_heads;
    const int kvd = c_.kv_heads * d;
    const double scale = static_cast<float>(c_.attention_scale());
    Rows out(static_cast<std::size_t>(n) * c_.heads * d);
    std::vector<double> p;
    for (int t = 0; t < n; ++t) {
      const int first = window > 0 ? std::max(0, t - window + 1) : 0;
      for (int head = 0; head < c_.heads; ++head) {
        const int g = head / group;
        const double* qv = q.data() + (static_cast<std::size_t>(t) * c_.heads + head) * d;
        p.assign(static_cast<std::size_t>(t - first + 1), 0);
        double m = -INFINITY;
        for (int j = first; j <= t; ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) dot = r(dot + r(qv[i] * k[j * kvd + g * d + i]));
          p[j - first] = r(scale * dot);
          if (c_.attn_softcap > 0)
            p[j - first] = soft_cap(p[j - first], static_cast<float>(c_.attn_softcap), r);
          m = std::max(m, p[j - first]);
        }
        double sum = 0;
        for (double& pj : p) {
          pj = r(std::exp(r(pj - m)), 2);
          sum = r(sum + pj);
        }
        for (int i = 0; i < d; ++i) {
          double o = 0;
          for (int j = first; j <= t; ++j) o = r(o + r(p[j - first] * v[j * kvd + g * d + i]));
          out[(static_cast<std::size_t>(t) * c_.heads + head) * d + i] = r(o / sum);
        }
      }
    }
    return out;
  }

  ModelConfig c_;
  WeightLayout layout_;
  std::vector<std::byte> region_;
  ModelWeights w_;
  bool float_mean_square_ = false;
  int prefill_ = 0;
  bool bf16_inputs_ = false;
};

// The worst |ours - reference| as a share of its bound (at most 1 when within), and where; and
// the mean of (error / sigma)^2 over what was checked, near 1 when the errors are the noise the
// model predicts (and held to kMeanSquareSigmas, 9: errors three times the model's, on average,
// mean a bug the per-logit bound is too wide to see).
constexpr double kMeanSquareSigmas = 9;

struct BoundCheck {
  double worst_share = 0;
  double worst_error = 0;
  int worst_index = -1;
  double square_sum = 0;
  std::int64_t count = 0;
  double mean_square() const { return count == 0 ? 0 : square_sum / static_cast<double>(count); }
  bool within() const { return worst_share <= 1 && mean_square() <= kMeanSquareSigmas; }
};

inline BoundCheck check_within(const float* ours, const double* reference, const double* bound,
                               const double* sigma, int n) {
  BoundCheck c;
  for (int i = 0; i < n; ++i) {
    const double error = std::fabs(static_cast<double>(ours[i]) - reference[i]);
    c.square_sum += (error / sigma[i]) * (error / sigma[i]);
    ++c.count;
    const double share = bound[i] > 0 ? error / bound[i] : (error > 0 ? INFINITY : 0);
    if (share > c.worst_share) {
      c.worst_share = share;
      c.worst_error = error;
      c.worst_index = i;
    }
  }
  return c;
}

// Whether the reference's best token is certain for a float32 evaluation within the bounds: its
// logit beyond every other by both bounds.
inline bool top1_certain(const double* reference, const double* bound, int n) {
  const int best = static_cast<int>(std::max_element(reference, reference + n) - reference);
  for (int i = 0; i < n; ++i) {
    if (i != best && reference[best] - bound[best] <= reference[i] + bound[i]) return false;
  }
  return true;
}

}  // namespace kvo::model::testing
