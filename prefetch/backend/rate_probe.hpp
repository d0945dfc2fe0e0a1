// The two rates split attention is planned by (CacheConfig::split, kAuto), measured when a cache
// is made where the config leaves them 0: how fast rows cross to the device, and how fast the
// host reads them where they live.
#pragma once

#include <cstddef>
#include <cstdint>

#include "prefetch/backend/backend.hpp"

namespace kvo::prefetch {

struct SplitRates {
  double h2d_bytes_per_s = 0;
  double host_bytes_per_s = 0;
  double seconds = 0;  // the probes' wall time
};

// h2d: the best of 3 timed copies of up to 32 MiB from `host` to `device` (backend.copy_sync).
// host: the best of 3 timed reads of up to 64 MiB of `host` by every core this process may use
// (the store's first pages, written once first so that they are real memory). Both regions are
// the cache's own, unused yet: `host` and `device` at least `bytes` long. About 50 ms for a
// buffer of 32 MiB or more on a PCIe 4 machine; less for smaller ones.
// Each rate only where asked for (`h2d`, `host_read`); 0 for the other.
SplitRates probe_split_rates(Backend& backend, std::byte* host, std::byte* device,
                             std::uint64_t bytes, bool h2d, bool host_read);

}  // namespace kvo::prefetch
