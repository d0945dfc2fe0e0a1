// One decode step on the host backend at several context lengths: bytes moved, and how much of
// the copy time the schedule hides behind a synthetic compute load.
//
// Each iteration runs one decode step in three caches of the same shape and context:
//   copy_only   streamed (R = 0), no compute: the step is as long as its copies;
//   compute     all resident, with the compute load: no copies at all;
//   overlapped  streamed (R = 0), with the compute load: what a real engine sees.
// hidden_fraction = (copy_only + compute - overlapped) / copy_only, clipped to [0, 1]: 1 means
// every copy ran while the caller computed; 0 means none did.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLayers = 8;
constexpr int kKvHeads = 8;
constexpr int kHeadDim = 128;  // bf16 rows of 2 KiB per tensor, as Llama-3-8B's

// An attention-shaped load: one f32 query against every valid K row of the layer, per slot.
// It reads the staged prefix, as attention would, and depends on every byte of it.
float synthetic_attention(const kvo::LayerView& view, int rounds) {
  float acc = 0;
  const auto row_elems = static_cast<std::size_t>(view.layout.kv_heads) * view.layout.head_dim;
  for (int s = 0; s < view.layout.slots; ++s) {
    const auto* k = static_cast<const std::uint16_t*>(view.k_row(s, 0));
    const int len = view.lengths[s] + view.new_tokens[s];
    for (int r = 0; r < rounds; ++r) {
      for (int t = 0; t < len; ++t) {
        const std::uint16_t* row = k + static_cast<std::size_t>(t) * row_elems;
        float dot = 0;
        for (std::size_t e = 0; e < row_elems; ++e) dot += static_cast<float>(row[e]) * 1e-6f;
        acc += std::tanh(dot);
      }
    }
  }
  return acc;
}

struct Engine {
  Engine(int context, int resident, bool with_compute) : compute(with_compute) {
    kvo::CacheConfig config;
    config.layers = kLayers;
    config.kv_heads = kKvHeads;
    config.head_dim = kHeadDim;
    config.max_seq = context + 1;
    config.slots = 1;
    config.dtype = kvo::DType::kBF16;
    config.resident_layers = resident;
    config.backend = kvo::BackendKind::kHost;
    cache = std::make_unique<kvo::OffloadedStaticCache>(config);
    rows.assign(static_cast<std::size_t>(context) * kKvHeads * kHeadDim, 0x3c00);
    step(context);  // prefill
  }

  // One step of n tokens; returns its wall time in seconds.
  double step(int n) {
    const auto start = Clock::now();
    cache->begin_step({n});
    for (int layer = 0; layer < kLayers; ++layer) {
      const kvo::LayerView view = cache->acquire(layer);
      cache->append(layer, 0, rows.data(), rows.data(), n);
      if (compute) sink += synthetic_attention(view, 1);
      cache->release(layer);
    }
    cache->end_step();
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // A decode step that leaves the context as it was.
  double decode() {
    const int context = cache->length(0);
    const double seconds = step(1);
    cache->truncate_slot(0, context);
    return seconds;
  }

  bool compute;
  std::unique_ptr<kvo::OffloadedStaticCache> cache;
  std::vector<std::uint16_t> rows;
  float sink = 0;
};

void BM_DecodeStepHost(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  Engine copy_only(context, 0, false);
  Engine compute(context, kLayers, true);
  Engine overlapped(context, 0, true);
  double t_copy = 0, t_compute = 0, t_overlap = 0;
  for (auto _ : state) {
    t_copy += copy_only.decode();
    t_compute += compute.decode();
    const double seconds = overlapped.decode();
    t_overlap += seconds;
    state.SetIterationTime(seconds);
  }
  const double n = static_cast<double>(state.iterations());
  const kvo::CacheStats st = overlapped.cache->stats();
  const double hidden = std::clamp((t_copy + t_compute - t_overlap) / t_copy, 0.0, 1.0);
  state.counters["context"] = context;
  state.counters["h2d_bytes_per_step"] = static_cast<double>(st.h2d_bytes_last_step);
  state.counters["d2h_bytes_per_step"] = static_cast<double>(st.d2h_bytes_last_step);
  state.counters["copy_only_step_s"] = t_copy / n;
  state.counters["compute_step_s"] = t_compute / n;
  state.counters["overlapped_step_s"] = t_overlap / n;
  state.counters["hidden_fraction"] = hidden;
  state.counters["h2d_GBps_copy_only"] =
      static_cast<double>(st.h2d_bytes_last_step) / (t_copy / n) * 1e-9;
  benchmark::DoNotOptimize(compute.sink + overlapped.sink);
}

BENCHMARK(BM_DecodeStepHost)
    ->ArgName("context")
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
