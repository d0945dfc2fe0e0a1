#include "prefetch/backend/rate_probe.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace kvo::prefetch {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sums `bytes` of `p` as 64-bit words (stored by the caller, so the reads are made).
std::uint64_t read_words(const std::byte* p, std::size_t bytes) {
  std::uint64_t sum = 0;
  std::uint64_t word = 0;
  for (std::size_t at = 0; at + sizeof(word) <= bytes; at += sizeof(word)) {
    std::memcpy(&word, p + at, sizeof(word));
    sum += word;
  }
  return sum;
}

}  // namespace

SplitRates probe_split_rates(Backend& backend, std::byte* host, std::byte* device,
                             std::uint64_t bytes, bool h2d, bool host_read) {
  const auto start = Clock::now();
  SplitRates rates;
  const std::size_t copy_bytes =
      h2d ? static_cast<std::size_t>(std::min<std::uint64_t>(bytes, 32ull << 20)) : 0;
  const std::size_t read_bytes =
      host_read ? static_cast<std::size_t>(std::min<std::uint64_t>(bytes, 64ull << 20)) : 0;
  std::memset(host, 1, std::max(copy_bytes, read_bytes));
  double best = 0;
  for (int round = 0; h2d && round < 3; ++round) {
    const auto t = Clock::now();
    backend.copy_sync(device, host, copy_bytes);
    const double s = seconds_since(t);
    if (s > 0) best = std::max(best, static_cast<double>(copy_bytes) / s);
  }
  rates.h2d_bytes_per_s = best;

  // The cores this process may use (its affinity), not the machine's.
  cpu_set_t set;
  CPU_ZERO(&set);
  const unsigned affinity =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? static_cast<unsigned>(CPU_COUNT(&set)) : 0;
  const unsigned threads =
      std::max(1u, affinity > 0 ? affinity : std::thread::hardware_concurrency());
  const std::size_t chunk = (read_bytes / threads + 63) / 64 * 64;
  std::vector<std::uint64_t> sums(threads);
  best = 0;
  for (int round = 0; host_read && round < 3; ++round) {
    std::vector<std::thread> pool;
    const auto t = Clock::now();
    for (unsigned i = 0; i < threads; ++i) {
      const std::size_t at = std::min(read_bytes, i * chunk);
      const std::size_t n = std::min(chunk, read_bytes - at);
      pool.emplace_back([&sums, i, p = host + at, n] { sums[i] = read_words(p, n); });
    }
    for (std::thread& th : pool) th.join();
    const double s = seconds_since(t);
    if (s > 0) best = std::max(best, static_cast<double>(read_bytes) / s);
  }
  rates.host_bytes_per_s = best;
  std::memset(host, 0, std::max(copy_bytes, read_bytes));
  rates.seconds = seconds_since(start);
  return rates;
}

}  // namespace kvo::prefetch
