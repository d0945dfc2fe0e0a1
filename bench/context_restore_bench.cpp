// Restoring a saved context against reading the same file: load_slot reads a slot's rows straight
// into the pinned host store (checking each layer block's XXH3) and should run at the machine's
// sequential read speed of the file. Both are measured in the same run, alternately, on the
// same file (in the page cache after the first pass, like `dd` of it), and printed as one JSON
// object: the median of each, and their ratio.
//
//   kvo_bench_context_restore [--tokens N] [--repeats R] [--dir DIR]
// Default: Llama-3-8B's KV shape (32 layers, 8 KV heads, head_dim 128, bf16), 8192 tokens
// (1 GiB), every layer streamed, host backend; 5 repeats; the file in $TMPDIR.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Reads the whole file in 1 MiB pieces, as `dd bs=1M of=/dev/null` does; returns seconds.
double sequential_read(const std::string& path, std::vector<char>& buffer) {
  const auto start = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) std::exit(1);
  while (::read(fd, buffer.data(), buffer.size()) > 0) {
  }
  ::close(fd);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 8192;
  int repeats = 5;
  std::string dir = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    if (name == "--tokens") tokens = std::atoi(argv[i + 1]);
    if (name == "--repeats") repeats = std::atoi(argv[i + 1]);
    if (name == "--dir") dir = argv[i + 1];
  }
  kvo::CacheConfig config;  // Llama-3-8B's KV shape, bf16
  config.max_seq = tokens;
  config.resident_layers = 0;
  config.backend = kvo::BackendKind::kHost;
  kvo::OffloadedStaticCache cache(config);

  // One prefill step of random rows.
  const std::size_t row = static_cast<std::size_t>(config.kv_heads) * config.head_dim * 2;
  std::vector<unsigned char> k(static_cast<std::size_t>(tokens) * row);
  std::vector<unsigned char> v(k.size());
  std::mt19937_64 rng(1);
  cache.begin_step({tokens});
  for (int layer = 0; layer < config.layers; ++layer) {
    for (std::size_t i = 0; i < k.size(); i += 8) {
      const std::uint64_t bits = rng();
      for (std::size_t b = 0; b < 8 && i + b < k.size(); ++b) {
        k[i + b] = static_cast<unsigned char>(bits >> (8 * b));
        v[i + b] = static_cast<unsigned char>(bits >> (8 * ((b + 3) % 8)));
      }
    }
    cache.acquire(layer);
    cache.append(layer, 0, k.data(), v.data(), tokens);
    cache.release(layer);
  }
  cache.end_step();

  const std::string path = dir + "/kvo_bench_context_" + std::to_string(::getpid()) + ".kvo";
  const auto save_start = Clock::now();
  cache.save_slot(0, path);
  const double save_s = std::chrono::duration<double>(Clock::now() - save_start).count();
  const std::uint64_t bytes = std::filesystem::file_size(path);

  std::vector<char> buffer(1 << 20);
  sequential_read(path, buffer);  // warm the page cache, as the first `dd` would
  std::vector<double> read_s;
  std::vector<double> load_s;
  for (int r = 0; r < repeats; ++r) {
    read_s.push_back(sequential_read(path, buffer));
    cache.reset_slot(0);
    const auto start = Clock::now();
    cache.load_slot(0, path);
    load_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (cache.length(0) != tokens) return 1;
  }
  std::remove(path.c_str());
  const double read_gbps = static_cast<double>(bytes) / median(read_s) * 1e-9;
  const double load_gbps = static_cast<double>(bytes) / median(load_s) * 1e-9;
  std::printf(
      "{\"file_bytes\":%llu,\"tokens\":%d,\"layers\":%d,\"repeats\":%d,\"save_s\":%.4f,"
      "\"sequential_read_GBps\":%.3f,\"load_GBps\":%.3f,\"load_over_read\":%.3f}\n",
      static_cast<unsigned long long>(bytes), tokens, config.layers, repeats, save_s, read_gbps,
      load_gbps, load_gbps / read_gbps);
  return 0;
}
