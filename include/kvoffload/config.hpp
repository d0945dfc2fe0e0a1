// kvo::CacheConfig: everything an OffloadedStaticCache is built from. Start from the defaults
// (a Llama-3-8B-shaped cache of 4096 tokens, one slot, bf16) and change what differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "kvoffload/api.h"

#include "kvoffload/types.hpp"

namespace kvo {

// Let the planner choose the number of resident layers: as many as the budget holds.
inline constexpr int kAutoResidentLayers = -1;

// A region of device memory a caller wants planned and allocated together with the cache
// (weights, activations, input rows for append): it is counted against the same budget and
// handed out by OffloadedStaticCache::reserved(name). Aligned to 256 bytes.
struct ReservedRegion {
  std::string name;
  std::uint64_t bytes = 0;
};

// Options that only the host backend reads.
struct HostBackendOptions {
  // Each copy (and each host function on a stream made by create_stream) first sleeps a
  // uniformly drawn 0..max_delay_us microseconds on its worker thread, so that any missing
  // ordering in the schedule shows up as wrong data. 0 disables it.
  std::uint32_t max_delay_us = 0;
  std::uint64_t delay_seed = 0;
};

// How a saved context's rows are read when it is restored. kMapped (the default): copied out of
// a mapping of the file with streaming stores, the fastest; but a page the system cannot deliver
// (the file shrunk by another process, a failing disk, a network file system gone) raises
// SIGBUS instead of an error. kPread: read with pread, which reports those as errors.
enum class ContextReading { kMapped, kPread };

// Split attention at decode. For each streamed layer, a decoding slot's rows [0, s) stay where
// they live, in the host store, for the caller to attend there (LayerView::host_k, host_v), and
// only rows [s, length) are prefetched: the caller attends the two parts apart and merges them
// by their log-sum-exps, which is exact. kAuto picks s from two rates, kRows takes a row count.
// A slot that appends other than one row in a step (a prefill chunk, or no row) never splits;
// resident and window layers never do. The cache cannot tell a prefill chunk of one row from a
// decode row: a caller that prefills a row at a time opens those steps with
// begin_step(new_tokens, split_rows) and no split rows.
enum class SplitMode { kOff, kAuto, kRows };
struct SplitOptions {
  SplitMode mode = SplitMode::kOff;
  int rows = 0;  // kRows: s = min(rows, length)
  // kAuto: s balances the bus against the host's attention, both reading the same rows:
  // s = length * host / (host + h2d), in whole 64s. Bytes per second; a rate left 0 is measured
  // when the cache is made (a timed copy into a staging buffer; a timed read of the host store
  // by the cores this process may use, an upper bound of what an attention kernel reads: a
  // caller with its own kernel gives host_bytes_per_s, as the decoder does, measuring its own:
  // at most about 200 ms in all), and CachePlan reports both.
  double h2d_bytes_per_s = 0;
  double host_bytes_per_s = 0;
};

// One rank of a tensor-parallel engine, which shards attention by KV heads: this cache holds the
// model's KV heads [kv_head_begin, kv_head_begin + kv_heads) of model_kv_heads (the whole model
// when model_kv_heads is 0). Nothing about the rows changes; the range is what a saved context
// records, so that a rank never restores another rank's heads, and what the plan reports.
// ranks_per_node: the processes of this node that share its host memory; each plans its pinned
// store against available / ranks_per_node. node_available_bytes: that available memory as the
// ranks measured it together before any of them allocated (0: host_available_bytes() when the
// cache is made, which counts the stores of ranks built before it as taken).
struct ShardOptions {
  int kv_head_begin = 0;
  int model_kv_heads = 0;  // 0: kv_heads (no shard)
  int ranks_per_node = 1;
  std::uint64_t node_available_bytes = 0;
};

struct CacheConfig {
  // Shape of the cache: K is [layer][slot][token][kv_head][head_dim], V the same with
  // v_head_dim (multi-head latent attention caches keys and values of different head sizes).
  int layers = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int v_head_dim = 0;  // 0: head_dim
  int max_seq = 4096;  // tokens per slot, statically allocated
  int slots = 1;       // sequences decoded together (the batch)
  DType dtype = DType::kBF16;

  // Sliding-window layers (Gemma's local layers, Mistral's): per layer, the keys its attention
  // sees (the last N, its own included), 0 for a full layer; empty: every layer is full. A layer
  // whose window buffer (window_rows) is shorter than max_seq is kept as a window layer: only the
  // rows its window can still need, in window_rows(window, max_append) rows per slot on the
  // device, resident, never streamed and never copied back. Such a layer's LayerView says where
  // its rows start (LayerView::first_positions). At least one layer must stay full.
  std::vector<int> layer_windows;
  // The most rows one append gives one slot of a window layer (a prefill chunk); needed (>= 1)
  // when a layer is kept as a window.
  int max_append = 0;

  // The full layers [0, resident_layers) (counted among full layers alone: window layers are
  // always on the device) stay whole on the device and never move; the rest are streamed
  // through ring_depth staging buffers. kAutoResidentLayers: as many as device_budget holds.
  // When the streamed layers are no more than ring_depth, every full layer is kept resident.
  int resident_layers = kAutoResidentLayers;
  int ring_depth = 2;

  // Device bytes the whole plan (resident layers + staging ring + reserved regions) must fit.
  // 0: on CUDA, the device's free memory when the cache is created less a headroom of
  // max(1 GiB, 5% of the device's memory) for cuBLAS, kernel modules loaded on first use and the
  // caller's own tensors (default_device_budget in plan.hpp); on the host backend, unlimited.
  std::uint64_t device_budget = 0;

  // Caller regions planned and allocated with the cache.
  std::vector<ReservedRegion> reserved;

  BackendKind backend = BackendKind::kAuto;
  int device = 0;  // CUDA device ordinal
  HostBackendOptions host;

  // load_slot(path) and load_slots(slots, path): how the file's rows are read.
  ContextReading context_reading = ContextReading::kMapped;

  SplitOptions split;

  ShardOptions shard;
};

// Throws kvo::Error(kInvalidArgument) naming the first field that is out of range.
KVO_API void validate(const CacheConfig& config);

}  // namespace kvo
