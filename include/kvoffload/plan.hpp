// The device-memory plan: one source of truth for every byte a cache allocates.
#pragma once

#include <cstdint>

#include "kvoffload/api.h"
#include "kvoffload/config.hpp"

namespace kvo {

// Where each K and V row of a cache lives in a layer-sized buffer: a resident layer, a staging
// buffer and a streamed layer of the host store all share this one layout. K, then V at
// v_begin(), each [slot][token][row]; a K row is one token's kv_heads x head_dim elements, a V row
// kv_heads x v_head_dim. A slot's rows [0, n) are one contiguous range of each tensor: staging a
// prefix is one copy per slot and tensor, appending a token one row.
struct KvLayout {
  int slots = 0;
  int max_seq = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;
  DType dtype = DType::kBF16;
  std::uint64_t element_size = 0;
  // One token of every kv head: elements, and for quantized dtypes the per-head scales after them
  // (kvoffload/quant.hpp).
  std::uint64_t k_row_bytes = 0;
  std::uint64_t v_row_bytes = 0;
  std::uint64_t k_scale_offset = 0;  // quantized dtypes: where a K row's scales start; else 0
  std::uint64_t v_scale_offset = 0;
  std::uint64_t k_tensor_bytes = 0;  // slots x max_seq K rows, padded to 256 bytes
  std::uint64_t v_tensor_bytes = 0;

  std::uint64_t layer_bytes() const { return k_tensor_bytes + v_tensor_bytes; }
  std::uint64_t v_begin() const { return k_tensor_bytes; }
  // Byte offsets of row (slot, token) from the start of K, and of V.
  std::uint64_t k_offset(int slot, int token) const { return row(slot, token) * k_row_bytes; }
  std::uint64_t v_offset(int slot, int token) const { return row(slot, token) * v_row_bytes; }
  // Bytes of `rows` consecutive K rows, and V rows.
  std::uint64_t k_bytes(std::int64_t rows) const {
    return static_cast<std::uint64_t>(rows) * k_row_bytes;
  }
  std::uint64_t v_bytes(std::int64_t rows) const {
    return static_cast<std::uint64_t>(rows) * v_row_bytes;
  }

 private:
  std::uint64_t row(int slot, int token) const {
    return static_cast<std::uint64_t>(slot) * static_cast<std::uint64_t>(max_seq) +
           static_cast<std::uint64_t>(token);
  }
};

// Bytes of one row of `kv_heads` heads of `dim` elements of `dtype`: kv_heads * dim * element size,
// or quant_row_bytes for the quantized dtypes. Throws kvo::Error(kInvalidArgument) on overflow.
KVO_API std::uint64_t kv_row_bytes(DType dtype, int kv_heads, int dim);

// The layout of a config's K/V. Throws kvo::Error(kInvalidArgument) when a size overflows 64 bits.
// REQUIRES: validate(config) passes.
KVO_API KvLayout kv_layout(const CacheConfig& config);

// Rows per slot of a window layer's buffer: a window of `window` keys needs the window - 1 rows
// before a step's first new row and the rows appended (at most max_append), kept in order. When
// an append would pass the buffer, the last window - 1 rows move to its front first. A gap of
// ceil((window - 1) / 8) rows more makes every such move shift them by more than an eighth of
// their count: it runs as at most 8 copies, none overlapping itself, and comes at most once per
// gap + 1 rows appended. (window - 1) + max_append + gap, rounded up to 64 rows (whole pages of
// the attention kernels' paged view).
KVO_API std::int64_t window_rows(int window, int max_append);
// Whether layer `layer` of the config is kept as a window layer (CacheConfig::layer_windows).
// REQUIRES: validate(config) passes.
KVO_API bool is_window_layer(const CacheConfig& config, int layer);
// The reserved region that holds the window layers' buffers (a config may not reserve the name).
inline constexpr const char* kWindowRegion = "kv windows";

struct CachePlan {
  int layers = 0;           // every layer: resident + streamed + window
  int resident_layers = 0;  // full layers on the device: all of them when nothing is streamed
  int streamed_layers = 0;  // full layers streamed
  int window_layers = 0;    // layers kept as windows (always on the device)
  int ring_depth = 0;       // staging buffers actually allocated (0 when nothing is streamed)

  KvLayout layout;                 // where each row lives in a layer-sized buffer
  std::uint64_t row_bytes = 0;     // one token of K: layout.k_row_bytes
  std::uint64_t tensor_bytes = 0;  // K of one layer: slots * max_seq rows, 256-aligned
  std::uint64_t layer_bytes = 0;   // K and V of one layer
  std::uint64_t resident_bytes = 0;
  std::uint64_t staging_bytes = 0;
  std::uint64_t reserved_bytes = 0;  // caller regions, each rounded up to 256 bytes
  std::uint64_t window_bytes = 0;    // K and V of the window layers' buffers
  std::uint64_t device_bytes = 0;    // resident + staging + window + reserved: one arena
  std::uint64_t host_bytes = 0;      // pinned host store: K and V of the streamed layers
  std::uint64_t budget = 0;          // the budget the plan was made against (0: none)

  // Split attention (CacheConfig::split): the mode, and under kAuto the rates s is chosen by,
  // given or measured when the cache was made (split_probe_s: the probes' time, 0 if none ran;
  // both rates 0 under another mode).
  SplitMode split = SplitMode::kOff;
  double split_h2d_bytes_per_s = 0;
  double split_host_bytes_per_s = 0;
  double split_probe_s = 0;

  // The KV heads this cache holds, [kv_head_begin, kv_head_begin + kv_heads) of model_kv_heads
  // (CacheConfig::shard; model_kv_heads is kv_heads without a shard), and the host memory it was
  // checked against: the node's available bytes / ranks_per_node.
  int kv_head_begin = 0;
  int model_kv_heads = 0;
  int ranks_per_node = 1;
  std::uint64_t host_share_bytes = 0;
};

// Rows split attention leaves on the host for a decoding slot of `length` rows: under kRows
// min(rows, length); under kAuto length * host / (host + h2d) rounded down to a whole 64 (both
// never shrink as the slot grows); 0 under kOff.
KVO_API int split_rows(const SplitOptions& split, int length);

// Device memory a CUDA cache leaves to others when its budget is left at 0: cuBLAS's workspace,
// kernel modules loaded on first use, the caller's own tensors. max(1 GiB, 5% of the device).
KVO_API std::uint64_t device_headroom(std::uint64_t total_bytes);
// The budget of such a cache: the device's free memory less device_headroom(total); 0 when the
// headroom takes it all.
KVO_API std::uint64_t default_device_budget(std::uint64_t free_bytes, std::uint64_t total_bytes);

// Bytes the plan needs for a given resident-layer count (before the "all fit" promotion).
// REQUIRES: validate(config) passes.
KVO_API std::uint64_t plan_device_bytes(const CacheConfig& config, int resident_layers);

// Turns a config and a device budget (0: unlimited) into a plan. With
// config.resident_layers == kAutoResidentLayers, keeps as many layers resident as fit.
// Throws kvo::Error(kOutOfMemory) naming the missing bytes when even the smallest plan, or the
// explicitly requested one, does not fit; kvo::Error(kInvalidArgument) for a bad config.
KVO_API CachePlan plan_cache(const CacheConfig& config, std::uint64_t budget);

// What this machine can give the pinned store: the larger of MemAvailable and MemTotal less
// Committed_AS (UINT64_MAX where /proc/meminfo cannot be read); or, where the environment sets
// KVO_HOST_MEMORY (bytes, as parse_size reads them), that figure. The override is for a virtual
// machine whose memory grows as it is used, where even MemTotal starts far below what it can
// give. Throws kvo::Error(kInvalidArgument) for a KVO_HOST_MEMORY it cannot read.
KVO_API std::uint64_t host_available_bytes();

}  // namespace kvo
