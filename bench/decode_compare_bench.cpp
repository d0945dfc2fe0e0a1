// The decode step against context length, for three caches in one binary and run:
//   all_resident  every layer on the device (only where it fits);
//   kvoffload     every layer streamed (R = 0) through a ring of 2;
//   hf_like       as transformers' offloaded static cache moves bytes (bench/hf_like_cache.hpp).
// Each reports its step time, the bytes it moved, and efficiency = floor / measured, where floor
// = those bytes / the pinned H2D bandwidth measured at the start of the same run.
//
//   kvo_bench_decode_compare [--shape=llama3-8b|small] [--backend=auto|cuda|host]
//                            [--dtype=bf16|f16|f32|fp8|int8] [--max-context=N]
//                            [Google Benchmark flags]
// Default shape: llama3-8b (4K..128K) on CUDA, small (1K..8K) on the host backend.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "bench/bench_common.hpp"
#include "bench/hf_like_cache.hpp"

namespace kvo::bench {
namespace {

struct Setup {
  CacheConfig shape;  // layers, heads, dtype, max_seq, backend
  std::vector<int> contexts;
  double h2d_bandwidth = 0;  // bytes/s, measured in this run
};
Setup g_setup;

// One of the three caches, created on first use and reused across contexts.
// Decode steps let the context grow by up to this many tokens before it is truncated back, so
// that the prefetches a truncation discards cost one step in kContextDrift.
constexpr int kContextDrift = 64;

struct StepBytes {
  std::uint64_t moved = 0;  // what the cache counted for the step
  std::uint64_t model = 0;  // what its byte model says the step moves
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Grows or truncates every slot to `context` tokens.
  virtual void set_context(int context) = 0;
  // One decode step (one token per slot), completed on the device.
  virtual StepBytes decode_step() = 0;
};

class CacheEngine final : public Engine {
 public:
  CacheEngine(CacheConfig config, bool resident) {
    config.resident_layers = resident ? config.layers : 0;
    config.ring_depth = 2;
    max_rows_ = static_cast<std::size_t>(config.max_seq);
    row_bytes_ = kv_row_bytes(config.dtype, config.kv_heads, config.head_dim);
    config.reserved.push_back({"rows", max_rows_ * row_bytes_});
    cache_ = std::make_unique<OffloadedStaticCache>(config);
    rows_ = cache_->reserved("rows");
    stream_ = cache_->backend() == BackendKind::kCuda ? cache_->create_stream() : nullptr;
  }
  ~CacheEngine() override {
    if (stream_ != nullptr) cache_->destroy_stream(stream_);
  }

  void set_context(int context) override {
    context_ = context;
    const int slots = cache_->config().slots;
    if (cache_->length(0) > context) {
      for (int s = 0; s < slots; ++s) cache_->truncate_slot(s, context);
    }
    if (cache_->length(0) < context) step(context - cache_->length(0));
  }
  // H2D: every streamed layer's valid prefix, K and V; D2H: the new row of each streamed layer.
  StepBytes decode_step() override {
    const CachePlan& plan = cache_->stats().plan;
    const auto slots = static_cast<std::uint64_t>(cache_->config().slots);
    const auto streamed = static_cast<std::uint64_t>(plan.streamed_layers);
    const auto length = static_cast<std::uint64_t>(cache_->length(0));
    step(1);
    cache_->synchronize_stream(stream_);
    const CacheStats st = cache_->stats();
    if (cache_->length(0) >= context_ + kContextDrift) set_context(context_);
    return {st.h2d_bytes_last_step + st.d2h_bytes_last_step,
            2 * streamed * slots * plan.row_bytes * (length + 1)};
  }

 private:
  void step(int n) {
    const int slots = cache_->config().slots;
    cache_->begin_step(std::vector<std::int32_t>(static_cast<std::size_t>(slots), n));
    for (int layer = 0; layer < cache_->config().layers; ++layer) {
      cache_->acquire(layer, stream_);
      for (int s = 0; s < slots; ++s) cache_->append(layer, s, rows_, rows_, n, stream_);
      cache_->release(layer, stream_);
    }
    cache_->end_step();
  }

  std::unique_ptr<OffloadedStaticCache> cache_;
  void* rows_ = nullptr;
  void* stream_ = nullptr;
  std::size_t max_rows_ = 0;
  std::size_t row_bytes_ = 0;
  int context_ = 0;
};

class HfLikeEngine final : public Engine {
 public:
  explicit HfLikeEngine(const CacheConfig& config)
      : backend_(prefetch::make_backend(config)),
        cache_(std::make_unique<HfLikeOffloadedCache>(*backend_, config)) {
    const std::size_t row = kv_row_bytes(config.dtype, config.kv_heads, config.head_dim);
    rows_ = static_cast<std::uint8_t*>(backend_->alloc_device(row));
    stream_ = backend_->kind() == BackendKind::kCuda ? backend_->create_stream() : nullptr;
  }
  ~HfLikeEngine() override {
    cache_.reset();
    if (stream_ != nullptr) backend_->destroy_stream(stream_);
    backend_->free_device(rows_);
  }
  void set_context(int context) override {
    context_ = context;
    cache_->set_length(context);
  }
  StepBytes decode_step() override {
    const std::uint64_t moved = cache_->decode_step(rows_, stream_);
    backend_->synchronize_stream(stream_);
    cache_->set_length(context_);
    return {moved, cache_->bytes_per_step_model()};
  }

 private:
  std::unique_ptr<prefetch::Backend> backend_;
  std::unique_ptr<HfLikeOffloadedCache> cache_;
  std::uint8_t* rows_ = nullptr;
  void* stream_ = nullptr;
  int context_ = 0;
};

// Engines live for the whole run: pinned allocations of many GiB are slow to make.
Engine* engine(const std::string& kind) {
  static std::map<std::string, std::unique_ptr<Engine>> engines;
  auto& slot = engines[kind];
  if (!slot) {
    if (kind == "hf_like") {
      slot = std::make_unique<HfLikeEngine>(g_setup.shape);
    } else {
      slot = std::make_unique<CacheEngine>(g_setup.shape, kind == "all_resident");
    }
  }
  return slot.get();
}

void BM_DecodeStep(benchmark::State& state, const std::string& kind) {
  const int context = static_cast<int>(state.range(0));
  Engine* e = nullptr;
  try {
    e = engine(kind);
    e->set_context(context);
  } catch (const Error& error) {
    state.SkipWithError(error.what());  // e.g. all_resident does not fit this device
    return;
  }
  std::uint64_t total_bytes = 0;
  double total_s = 0;
  bool exact = true;
  for (auto _ : state) {
    const auto start = Clock::now();
    const StepBytes step = e->decode_step();
    const double seconds = seconds_since(start);
    total_s += seconds;
    total_bytes += step.moved;
    exact = exact && step.moved == step.model;
    state.SetIterationTime(seconds);
  }
  if (!exact) {
    state.SkipWithError("bytes moved differ from the cache's byte model");
    return;
  }
  const std::uint64_t bytes = total_bytes / static_cast<std::uint64_t>(state.iterations());
  const double step_s = total_s / static_cast<double>(state.iterations());
  const double floor_s = static_cast<double>(bytes) / g_setup.h2d_bandwidth;
  state.counters["context"] = context;
  state.counters["bytes_per_step"] = static_cast<double>(bytes);
  state.counters["step_s"] = step_s;
  state.counters["floor_s"] = floor_s;
  if (bytes > 0) state.counters["efficiency"] = floor_s / step_s;
  state.counters["moved_GBps"] = static_cast<double>(bytes) / step_s * 1e-9;
  state.counters["pinned_h2d_GBps"] = g_setup.h2d_bandwidth * 1e-9;
  state.counters["tokens_per_s"] = g_setup.shape.slots / step_s;
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  try {
    const auto backend =
        resolve_backend(kvo::parse_backend(take_flag(&argc, argv, "backend", "auto")));
    const bool cuda = backend == kvo::BackendKind::kCuda;
    const std::string shape = take_flag(&argc, argv, "shape", cuda ? "llama3-8b" : "small");
    kvo::CacheConfig& c = g_setup.shape;
    c.backend = backend;
    if (shape == "llama3-8b") {
      c.layers = 32, c.kv_heads = 8, c.head_dim = 128;
      g_setup.contexts = {4096, 8192, 16384, 32768, 65536, 131072};
    } else if (shape == "small") {
      c.layers = 8, c.kv_heads = 2, c.head_dim = 64;
      g_setup.contexts = {1024, 2048, 4096, 8192};
    } else {
      std::fprintf(stderr, "unknown --shape=%s (llama3-8b or small)\n", shape.c_str());
      return 2;
    }
    const int max_context = std::stoi(take_flag(&argc, argv, "max-context", "0"));
    if (max_context > 0) {
      std::vector<int> kept;
      for (int ctx : g_setup.contexts) {
        if (ctx <= max_context) kept.push_back(ctx);
      }
      g_setup.contexts = kept;
    }
    c.dtype = kvo::parse_dtype(take_flag(&argc, argv, "dtype", "bf16"));
    c.slots = 1;
    c.max_seq = g_setup.contexts.back() + kContextDrift + 1;
    auto probe = kvo::prefetch::make_backend(c);
    g_setup.h2d_bandwidth = measure_h2d_bandwidth(*probe, cuda ? (256u << 20) : (32u << 20), 8);
    std::fprintf(stderr, "shape %s on %s: pinned H2D %.2f GB/s\n", shape.c_str(),
                 kvo::backend_name(backend), g_setup.h2d_bandwidth * 1e-9);
    for (const char* kind : {"all_resident", "kvoffload", "hf_like"}) {
      auto* b =
          benchmark::RegisterBenchmark((std::string("BM_DecodeStep/") + kind).c_str(),
                                       [kind](benchmark::State& st) { BM_DecodeStep(st, kind); });
      for (int ctx : g_setup.contexts) b->Arg(ctx);
      b->ArgName("context")->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvo_bench_decode_compare: %s\n", e.what());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
