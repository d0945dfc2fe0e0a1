// The ceiling every other figure is measured against: H2D and D2H copy bandwidth against
// transfer size (64 KiB to 1 GiB), each direction alone and both at once, on the copy streams
// the cache itself uses (pinned host memory and cudaMemcpyAsync on CUDA; worker threads on the
// host backend).
//
//   kvo_bench_bandwidth [--backend=auto|cuda|host] [--max-bytes=N] [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>

#include "bench/bench_common.hpp"

namespace kvo::bench {
namespace {

std::unique_ptr<prefetch::Backend> g_backend;

enum Direction { kH2D = 0, kD2H = 1, kBoth = 2 };

void BM_Copy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto direction = static_cast<Direction>(state.range(1));
  prefetch::Backend& b = *g_backend;
  void* host = b.alloc_host(2 * bytes);
  void* device = b.alloc_device(2 * bytes);
  void* h2d = b.create_stream();
  void* d2h = b.create_stream();
  auto* host_in = static_cast<std::uint8_t*>(host);
  auto* host_out = host_in + bytes;
  auto* device_in = static_cast<std::uint8_t*>(device);
  auto* device_out = device_in + bytes;
  // Small transfers are batched so that one iteration moves at least 64 MiB per direction.
  const std::size_t batch = std::max<std::size_t>(1, (64u << 20) / bytes);
  for (auto _ : state) {
    const auto start = Clock::now();
    for (std::size_t i = 0; i < batch; ++i) {
      if (direction != kD2H) b.copy_async(device_in, host_in, bytes, h2d);
      if (direction != kH2D) b.copy_async(host_out, device_out, bytes, d2h);
    }
    b.synchronize_stream(h2d);
    b.synchronize_stream(d2h);
    state.SetIterationTime(seconds_since(start));
  }
  const double per_iteration = static_cast<double>(bytes * batch) * (direction == kBoth ? 2 : 1);
  state.SetBytesProcessed(static_cast<std::int64_t>(per_iteration) * state.iterations());
  state.counters["transfer_bytes"] = static_cast<double>(bytes);
  b.destroy_stream(h2d);
  b.destroy_stream(d2h);
  b.free_device(device);
  b.free_host(host);
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  std::int64_t max_bytes = 0;
  try {
    kvo::CacheConfig config;
    config.backend = resolve_backend(kvo::parse_backend(take_flag(&argc, argv, "backend", "auto")));
    const bool cuda = config.backend == kvo::BackendKind::kCuda;
    max_bytes = static_cast<std::int64_t>(
        kvo::parse_size(take_flag(&argc, argv, "max-bytes", cuda ? "1GiB" : "64MiB")));
    g_backend = kvo::prefetch::make_backend(config);
    std::fprintf(stderr, "copy bandwidth on the %s backend\n", kvo::backend_name(config.backend));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvo_bench_bandwidth: %s\n", e.what());
    return 1;
  }
  for (const char* name : {"H2D", "D2H", "both"}) {
    const std::int64_t direction = name[0] == 'H' ? kH2D : (name[0] == 'D' ? kD2H : kBoth);
    auto* b = benchmark::RegisterBenchmark((std::string("BM_Copy/") + name).c_str(), BM_Copy);
    for (std::int64_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) b->Args({bytes, direction});
    b->ArgNames({"bytes", "dir"})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_backend.reset();
  return 0;
}
