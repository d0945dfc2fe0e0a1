// A caller kernel that reads its view slowly: for the write-after-read test on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvo::testing {

// On `stream` (a cudaStream_t): spins for about `cycles` GPU clock cycles, then copies `count`
// 16-bit elements from src to dst (device memory). Throws kvo::Error for a launch failure.
void slow_copy(const std::uint16_t* src, std::uint16_t* dst, std::size_t count, long long cycles,
               void* stream);

// On `stream`: a kernel that traps, leaving the CUDA context with a sticky error.
void trap(void* stream);

}  // namespace kvo::testing
