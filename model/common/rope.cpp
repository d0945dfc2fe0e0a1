#include "model/common/rope.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace kvo::model {

const char* rope_type_name(RopeType type) {
  switch (type) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kDynamic:
      return "dynamic";
    case RopeType::kYarn:
      return "yarn";
    case RopeType::kLongRope:
      return "longrope";
    case RopeType::kLlama3:
      return "llama3";
  }
  return "?";
}

std::string rope_type_names() {
  std::string names;
  for (RopeType t : {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic, RopeType::kYarn,
                     RopeType::kLongRope, RopeType::kLlama3}) {
    names += (names.empty() ? "" : ", ") + std::string(rope_type_name(t));
  }
  return names;
}

std::string describe(const RopeScaling& s) {
  std::ostringstream out;
  out.precision(9);
  out << rope_type_name(s.type);
  if (s.type == RopeType::kDefault) return out.str();
  out << " factor=" << s.factor;
  if (s.type == RopeType::kLlama3) {
    out << " low_freq_factor=" << s.low_freq_factor << " high_freq_factor=" << s.high_freq_factor;
  }
  if (s.type == RopeType::kLlama3 || s.type == RopeType::kYarn || s.type == RopeType::kLongRope) {
    out << " original_max_position=" << s.original_max_position;
  }
  if (s.type == RopeType::kYarn) {
    out << " beta_fast=" << s.beta_fast << " beta_slow=" << s.beta_slow
        << " truncate=" << (s.truncate ? 1 : 0);
  }
  if (s.type == RopeType::kYarn || s.type == RopeType::kLongRope) {
    out << " attention_factor=" << s.attention_factor;
  }
  if (s.type == RopeType::kLongRope) {
    out << " short_factor=";
    for (std::size_t i = 0; i < s.short_factor.size(); ++i) {
      out << (i ? "," : "") << s.short_factor[i];
    }
    out << " long_factor=";
    for (std::size_t i = 0; i < s.long_factor.size(); ++i) {
      out << (i ? "," : "") << s.long_factor[i];
    }
  }
  return out.str();
}

bool rope_depends_on_length(const RopeScaling& scaling) {
  return scaling.type == RopeType::kDynamic || scaling.type == RopeType::kLongRope;
}

namespace {

// theta^(2i/dim) in float32, the exponent a float32 quotient: transformers'
// base ** (arange(0, dim, 2).float() / dim).
float base_power(float theta, int i, int dim) {
  return std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
}

// Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between.
float llama3_inv_freq(float inv_freq, const RopeScaling& s) {
  const auto factor = static_cast<float>(s.factor);
  const auto low = static_cast<float>(s.low_freq_factor);
  const auto high = static_cast<float>(s.high_freq_factor);
  const auto old_len = static_cast<float>(s.original_max_position);
  const float pi = 3.14159265358979323846f;
  const float wavelen = 2.0f * pi / inv_freq;
  if (wavelen > old_len / low) return inv_freq / factor;
  if (wavelen < old_len / high) return inv_freq;
  const float smooth = (old_len / wavelen - low) / (high - low);
  return (1.0f - smooth) * inv_freq / factor + smooth * inv_freq;
}

// YaRN: interpolated (divided by factor) below the correction range, extrapolated (kept) above
// it, a linear ramp across it.
void yarn_inv_freq(const RopeScaling& s, float theta, int dim, float* out) {
  const double base = theta;
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(s.original_max_position / (rotations * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast);
  double high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // no empty ramp
  const auto factor = static_cast<float>(s.factor);
  for (int i = 0; i < dim / 2; ++i) {
    const float pos_freq = base_power(theta, i, dim);
    const float extrapolated = 1.0f / pos_freq;
    const float interpolated = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp(
        (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f,
        1.0f);
    const float keep = 1.0f - ramp;
    out[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
}

}  // namespace

RopeTable rope_table(const RopeScaling& s, float theta, int head_dim, int max_position_embeddings,
                     std::int64_t seq_len) {
  const int half = head_dim / 2;
  RopeTable t;
  t.inv_freq.resize(static_cast<std::size_t>(half));
  float* inv = t.inv_freq.data();
  switch (s.type) {
    case RopeType::kYarn:
      yarn_inv_freq(s, theta, head_dim, inv);
      t.scale = static_cast<float>(s.attention_factor);
      return t;
    case RopeType::kLongRope: {
      const bool use_long = static_cast<double>(seq_len) > s.original_max_position;
      const std::vector<double>& ext = use_long ? s.long_factor : s.short_factor;
      for (int i = 0; i < half; ++i) {
        inv[i] = 1.0f / (static_cast<float>(ext[static_cast<std::size_t>(i)]) *
                         base_power(theta, i, head_dim));
      }
      t.scale = static_cast<float>(s.attention_factor);
      return t;
    }
    case RopeType::kDynamic: {
      // The base stretched for the forward's length once past max_position_embeddings, in
      // float32 as transformers computes it in a forward (its length a tensor there); within
      // max_position_embeddings, the base itself.
      float base = theta;
      if (seq_len > max_position_embeddings) {
        const auto factor = static_cast<float>(s.factor);
        const float ratio =
            factor * static_cast<float>(seq_len) / static_cast<float>(max_position_embeddings) -
            static_cast<float>(s.factor - 1);
        base = theta *
               std::pow(ratio, static_cast<float>(static_cast<double>(head_dim) / (head_dim - 2)));
      }
      for (int i = 0; i < half; ++i) inv[i] = 1.0f / base_power(base, i, head_dim);
      return t;
    }
    case RopeType::kDefault:
    case RopeType::kLinear:
    case RopeType::kLlama3:
      for (int i = 0; i < half; ++i) {
        inv[i] = 1.0f / base_power(theta, i, head_dim);
        if (s.type == RopeType::kLinear) inv[i] /= static_cast<float>(s.factor);
        if (s.type == RopeType::kLlama3) inv[i] = llama3_inv_freq(inv[i], s);
      }
      return t;
  }
  return t;
}

RopeSchedule::RopeSchedule(const RopeScaling& scaling, float theta, int head_dim,
                           int max_position_embeddings)
    : scaling_(scaling),
      theta_(theta),
      head_dim_(head_dim),
      max_position_(max_position_embeddings),
      cached_len_(max_position_embeddings),
      original_len_(max_position_embeddings) {
  // As transformers starts: the table of no length (dynamic: max_position_embeddings' base;
  // longrope: the short factors).
  table_ = rope_table(scaling_, theta_, head_dim_, max_position_, 0);
}

bool RopeSchedule::update(std::int64_t seq_len) {
  if (scaling_.type == RopeType::kLongRope) {
    const bool use_long = static_cast<double>(seq_len) > scaling_.original_max_position;
    if (use_long == long_) return false;
    long_ = use_long;
    table_ = rope_table(scaling_, theta_, head_dim_, max_position_, seq_len);
    return true;
  }
  if (scaling_.type != RopeType::kDynamic) return false;
  bool changed = false;
  if (seq_len > cached_len_) {  // growth
    table_ = rope_table(scaling_, theta_, head_dim_, max_position_, seq_len);
    cached_len_ = seq_len;
    changed = true;
  }
  if (seq_len < original_len_ && cached_len_ > original_len_) {  // back inside: the original
    table_ = rope_table(scaling_, theta_, head_dim_, max_position_, 0);
    cached_len_ = original_len_;
    changed = true;
  }
  return changed;
}

}  // namespace kvo::model
