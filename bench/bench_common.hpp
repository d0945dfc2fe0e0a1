// What the benchmarks share: command-line shape selection, the backend they run on, and the
// pinned-bandwidth measurement every efficiency figure is relative to.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "prefetch/backend/backend.hpp"

namespace kvo::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Removes `--name=value` from argv (so Google Benchmark does not see it) and returns the value.
inline std::string take_flag(int* argc, char** argv, const std::string& name,
                             const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  std::string value = fallback;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind(prefix, 0) == 0) {
      value = arg.substr(prefix.size());
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return value;
}

// Pinned host -> device (or host -> "device" on the host backend) bandwidth in bytes/s: one
// `bytes` copy repeated `repeats` times on one stream, after a warm-up.
inline double measure_h2d_bandwidth(prefetch::Backend& backend, std::size_t bytes, int repeats) {
  void* host = backend.alloc_host(bytes);
  void* device = backend.alloc_device(bytes);
  void* stream = backend.create_stream();
  backend.copy_async(device, host, bytes, stream);
  backend.synchronize_stream(stream);
  const auto start = Clock::now();
  for (int i = 0; i < repeats; ++i) backend.copy_async(device, host, bytes, stream);
  backend.synchronize_stream(stream);
  const double seconds = seconds_since(start);
  backend.destroy_stream(stream);
  backend.free_device(device);
  backend.free_host(host);
  return static_cast<double>(bytes) * repeats / seconds;
}

}  // namespace kvo::bench
