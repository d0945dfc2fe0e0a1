// Config validation and the device-memory plan.
#include "kvoffload/plan.hpp"
#include "kvoffload/quant.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "kvoffload/error.hpp"
#include "offload/store/window_layers.hpp"
#include "offload/util/checked_math.hpp"

namespace kvo {

namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

void require_positive(int value, const char* name) {
  if (value <= 0) {
    throw invalid(std::string("CacheConfig.") + name + " must be positive, got " +
                  std::to_string(value));
  }
}

std::uint64_t reserved_bytes(const CacheConfig& config) {
  std::uint64_t total = 0;
  for (const ReservedRegion& region : config.reserved) {
    total = offload::checked_add(total, offload::align_up(region.bytes, offload::kDeviceAlignment),
                                 "reserved device regions");
  }
  return total;
}

std::uint64_t layer_bytes(const CacheConfig& config) {
  return kv_layout(config).layer_bytes();
}

int effective_resident(const CacheConfig& config, int resident) {
  return config.layers - resident <= config.ring_depth ? config.layers : resident;
}

}  // namespace

std::uint64_t device_headroom(std::uint64_t total_bytes) {
  return std::max<std::uint64_t>(1ull << 30, total_bytes / 20);
}

std::uint64_t default_device_budget(std::uint64_t free_bytes, std::uint64_t total_bytes) {
  const std::uint64_t headroom = device_headroom(total_bytes);
  return free_bytes > headroom ? free_bytes - headroom : 0;
}

std::uint64_t kv_row_bytes(DType dtype, int kv_heads, int dim) {
  using offload::checked_mul;
  const std::uint64_t elements = checked_mul(static_cast<std::uint64_t>(kv_heads),
                                             static_cast<std::uint64_t>(dim), "row bytes");
  // A quantized row (quant.hpp) of int-sized heads stays far below 2^64: below 2^63 + 2^34.
  if (is_quantized(dtype)) return quant_row_bytes(kv_heads, dim);
  return checked_mul(elements, dtype_size(dtype), "row bytes");
}

KvLayout kv_layout(const CacheConfig& config) {
  using offload::checked_mul;
  const auto u64 = [](int x) { return static_cast<std::uint64_t>(x); };
  KvLayout layout;
  layout.slots = config.slots;
  layout.max_seq = config.max_seq;
  layout.kv_heads = config.kv_heads;
  layout.head_dim = config.head_dim;
  layout.v_head_dim = config.v_head_dim == 0 ? config.head_dim : config.v_head_dim;
  layout.dtype = config.dtype;
  layout.element_size = dtype_size(config.dtype);
  layout.k_row_bytes = kv_row_bytes(config.dtype, config.kv_heads, layout.head_dim);
  layout.v_row_bytes = kv_row_bytes(config.dtype, config.kv_heads, layout.v_head_dim);
  if (is_quantized(config.dtype)) {
    layout.k_scale_offset = quant_scale_offset(config.kv_heads, layout.head_dim);
    layout.v_scale_offset = quant_scale_offset(config.kv_heads, layout.v_head_dim);
  }
  const std::uint64_t rows = checked_mul(u64(config.slots), u64(config.max_seq), "rows");
  layout.k_tensor_bytes = offload::align_up(checked_mul(rows, layout.k_row_bytes, "tensor bytes"),
                                            offload::kDeviceAlignment);
  layout.v_tensor_bytes = offload::align_up(checked_mul(rows, layout.v_row_bytes, "tensor bytes"),
                                            offload::kDeviceAlignment);
  offload::checked_add(layout.k_tensor_bytes, layout.v_tensor_bytes, "layer bytes");
  return layout;
}

std::int64_t window_rows(int window, int max_append) {
  const std::int64_t keep = static_cast<std::int64_t>(window) - 1;
  const std::int64_t rows = keep + max_append + (keep + 7) / 8;
  return (rows + 63) / 64 * 64;
}

int split_rows(const SplitOptions& split, int length) {
  switch (split.mode) {
    case SplitMode::kOff:
      return 0;
    case SplitMode::kRows:
      return std::min(std::max(0, split.rows), length);
    case SplitMode::kAuto: {
      if (!(split.host_bytes_per_s + split.h2d_bytes_per_s > 0)) return 0;
      const double share =
          split.host_bytes_per_s / (split.host_bytes_per_s + split.h2d_bytes_per_s);
      const auto rows = static_cast<std::int64_t>(std::floor(length * share));  // <= length
      return static_cast<int>(rows >= length ? length : rows / 64 * 64);
    }
  }
  return 0;
}

bool is_window_layer(const CacheConfig& config, int layer) {
  if (config.layer_windows.empty()) return false;
  const int window = config.layer_windows[static_cast<std::size_t>(layer)];
  return window > 0 && window_rows(window, config.max_append) < config.max_seq;
}

namespace offload {

WindowPlan plan_windows(const CacheConfig& config) {
  WindowPlan p;
  p.full = config;
  p.full.layer_windows.clear();
  p.full_index.assign(static_cast<std::size_t>(config.layers), -1);
  p.window_index.assign(static_cast<std::size_t>(config.layers), -1);
  int full = 0;
  for (int l = 0; l < config.layers; ++l) {
    if (!is_window_layer(config, l)) {
      p.full_index[static_cast<std::size_t>(l)] = full++;
      continue;
    }
    WindowPlan::Window w;
    w.layer = l;
    w.window = config.layer_windows[static_cast<std::size_t>(l)];
    CacheConfig shape = p.full;
    shape.max_seq = static_cast<int>(window_rows(w.window, config.max_append));
    w.layout = kv_layout(shape);
    w.offset = p.bytes;
    p.bytes = checked_add(p.bytes, w.layout.layer_bytes(), "window bytes");
    p.window_index[static_cast<std::size_t>(l)] = static_cast<int>(p.windows.size());
    p.windows.push_back(w);
  }
  p.full.layers = full;
  if (!p.windows.empty()) p.full.reserved.push_back({kWindowRegion, p.bytes});
  return p;
}

}  // namespace offload

namespace {

void validate_full(const CacheConfig& config);

}  // namespace

void validate(const CacheConfig& config) {
  validate_full(config);
  for (const ReservedRegion& region : config.reserved) {
    if (region.name == kWindowRegion) {
      throw invalid(std::string("the reserved device region name '") + kWindowRegion +
                    "' is the cache's own (its window layers)");
    }
  }
  if (config.layer_windows.empty()) return;
  if (static_cast<int>(config.layer_windows.size()) != config.layers) {
    throw invalid("CacheConfig.layer_windows has " + std::to_string(config.layer_windows.size()) +
                  " entries for " + std::to_string(config.layers) + " layers");
  }
  bool windowed = false;
  for (std::size_t l = 0; l < config.layer_windows.size(); ++l) {
    const int w = config.layer_windows[l];
    if (w < 0) {
      throw invalid("CacheConfig.layer_windows[" + std::to_string(l) +
                    "] must be 0 (full) or a window of keys, got " + std::to_string(w));
    }
    windowed = windowed || w > 0;
  }
  if (windowed && (config.max_append < 1 || config.max_append > config.max_seq)) {
    throw invalid("CacheConfig.max_append must be from 1 to max_seq (" +
                  std::to_string(config.max_seq) + ") with window layers, got " +
                  std::to_string(config.max_append));
  }
  int full = 0;
  for (int l = 0; l < config.layers; ++l) full += is_window_layer(config, l) ? 0 : 1;
  if (full == 0) {
    throw invalid(
        "every layer of this config would be a window layer; at least one must stay full "
        "(a cache of window layers alone is not built)");
  }
  if (config.resident_layers != kAutoResidentLayers && config.resident_layers > full) {
    throw invalid("CacheConfig.resident_layers counts full layers: at most " +
                  std::to_string(full) + " here, got " + std::to_string(config.resident_layers));
  }
}

namespace {

void validate_full(const CacheConfig& config) {
  const SplitOptions& split = config.split;
  if (split.mode != SplitMode::kOff && split.mode != SplitMode::kAuto &&
      split.mode != SplitMode::kRows) {
    throw invalid("CacheConfig.split.mode is not a SplitMode (" +
                  std::to_string(static_cast<int>(split.mode)) + ")");
  }
  if (split.rows < 0) {
    throw invalid("CacheConfig.split.rows must not be negative; got " + std::to_string(split.rows));
  }
  if (!(split.h2d_bytes_per_s >= 0) || !(split.host_bytes_per_s >= 0) ||
      !std::isfinite(split.h2d_bytes_per_s) || !std::isfinite(split.host_bytes_per_s)) {
    throw invalid("CacheConfig.split rates must be finite and not negative (0: measured)");
  }
  require_positive(config.layers, "layers");
  require_positive(config.kv_heads, "kv_heads");
  const ShardOptions& shard = config.shard;
  if (shard.model_kv_heads < 0 || shard.kv_head_begin < 0 ||
      (shard.model_kv_heads == 0 && shard.kv_head_begin != 0) ||
      (shard.model_kv_heads > 0 &&
       static_cast<std::int64_t>(shard.kv_head_begin) + config.kv_heads > shard.model_kv_heads)) {
    throw invalid(
        "CacheConfig.shard holds KV heads [kv_head_begin, kv_head_begin + kv_heads) of "
        "model_kv_heads (0: kv_heads, no shard); got kv_head_begin " +
        std::to_string(shard.kv_head_begin) + ", kv_heads " + std::to_string(config.kv_heads) +
        ", model_kv_heads " + std::to_string(shard.model_kv_heads));
  }
  if (shard.ranks_per_node < 1 || shard.ranks_per_node > 4096) {
    throw invalid("CacheConfig.shard.ranks_per_node must be from 1 to 4096, got " +
                  std::to_string(shard.ranks_per_node));
  }
  require_positive(config.head_dim, "head_dim");
  if (config.v_head_dim < 0) {
    throw invalid("CacheConfig.v_head_dim must be positive, or 0 for head_dim; got " +
                  std::to_string(config.v_head_dim));
  }
  require_positive(config.max_seq, "max_seq");
  require_positive(config.slots, "slots");
  require_positive(config.ring_depth, "ring_depth");
  if (config.resident_layers != kAutoResidentLayers &&
      (config.resident_layers < 0 || config.resident_layers > config.layers)) {
    throw invalid("CacheConfig.resident_layers must be between 0 and layers (" +
                  std::to_string(config.layers) + ") or kAutoResidentLayers, got " +
                  std::to_string(config.resident_layers));
  }
  if (config.device < 0) {
    throw invalid("CacheConfig.device must be >= 0, got " + std::to_string(config.device));
  }
  std::set<std::string> names;
  for (const ReservedRegion& region : config.reserved) {
    if (region.name.empty()) throw invalid("a reserved device region needs a name");
    if (!names.insert(region.name).second) {
      throw invalid("the reserved device region '" + region.name + "' is listed twice");
    }
  }
  // Throws if the whole cache, every layer K and V, overflows 64 bits.
  offload::checked_mul(layer_bytes(config), static_cast<std::uint64_t>(config.layers),
                       "cache bytes");
  (void)reserved_bytes(config);
}

// The device bytes of a config of full layers alone (windows a reserved region already).
std::uint64_t full_device_bytes(const CacheConfig& config, int resident_layers) {
  const int resident = effective_resident(config, resident_layers);
  const int buffers = resident == config.layers ? config.layers : resident + config.ring_depth;
  const std::uint64_t layer = layer_bytes(config);
  return offload::checked_add(
      offload::checked_mul(layer, static_cast<std::uint64_t>(buffers), "device bytes"),
      reserved_bytes(config), "device bytes");
}

// The plan of a config of full layers alone.
CachePlan plan_full(const CacheConfig& config, std::uint64_t budget) {
  validate_full(config);
  int resident = config.resident_layers;
  if (resident == kAutoResidentLayers) {
    resident = config.layers;
    if (budget != 0) {
      while (resident > 0 && full_device_bytes(config, resident) > budget) --resident;
    }
  }
  const std::uint64_t need = full_device_bytes(config, resident);
  if (budget != 0 && need > budget) {
    throw Error(ErrorCode::kOutOfMemory,
                "the cache needs " + format_bytes(need) + " of device memory (" +
                    std::to_string(effective_resident(config, resident)) +
                    " resident layers, a ring of " + std::to_string(config.ring_depth) +
                    ", reserved regions) but the budget is " + format_bytes(budget) + ": missing " +
                    format_bytes(need - budget) +
                    ". Raise the budget, or lower max_seq, slots, ring_depth or resident_layers");
  }

  CachePlan plan;
  plan.layers = config.layers;
  plan.resident_layers = effective_resident(config, resident);
  plan.streamed_layers = config.layers - plan.resident_layers;
  plan.ring_depth = plan.streamed_layers == 0 ? 0 : config.ring_depth;
  plan.layout = kv_layout(config);
  plan.row_bytes = plan.layout.k_row_bytes;
  plan.tensor_bytes = plan.layout.k_tensor_bytes;
  plan.layer_bytes = plan.layout.layer_bytes();
  plan.resident_bytes = offload::checked_mul(
      plan.layer_bytes, static_cast<std::uint64_t>(plan.resident_layers), "resident bytes");
  plan.staging_bytes = offload::checked_mul(
      plan.layer_bytes, static_cast<std::uint64_t>(plan.ring_depth), "staging bytes");
  plan.reserved_bytes = reserved_bytes(config);
  plan.device_bytes = need;
  plan.host_bytes = offload::checked_mul(
      plan.layer_bytes, static_cast<std::uint64_t>(plan.streamed_layers), "host bytes");
  plan.budget = budget;
  if (plan.resident_bytes + plan.staging_bytes + plan.reserved_bytes != plan.device_bytes) {
    throw Error(ErrorCode::kInternal, "device plan does not add up");
  }
  return plan;
}

}  // namespace

std::uint64_t plan_device_bytes(const CacheConfig& config, int resident_layers) {
  const offload::WindowPlan windows = offload::plan_windows(config);
  return full_device_bytes(windows.full, resident_layers);
}

CachePlan plan_cache(const CacheConfig& config, std::uint64_t budget) {
  validate(config);
  const offload::WindowPlan windows = offload::plan_windows(config);
  CachePlan plan = plan_full(windows.full, budget);
  plan.layers = config.layers;
  plan.kv_head_begin = config.shard.kv_head_begin;
  plan.model_kv_heads =
      config.shard.model_kv_heads > 0 ? config.shard.model_kv_heads : config.kv_heads;
  plan.ranks_per_node = config.shard.ranks_per_node;
  plan.window_layers = static_cast<int>(windows.windows.size());
  if (plan.window_layers > 0) {
    plan.window_bytes = offload::align_up(windows.bytes, offload::kDeviceAlignment);
    plan.reserved_bytes -= plan.window_bytes;
  }
  return plan;
}

}  // namespace kvo
