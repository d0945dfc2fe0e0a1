// slow_copy in a build without CUDA: the CUDA tests that call it skip before they get here.
#include "kvoffload/error.hpp"
#include "prefetch/slow_reader.hpp"

namespace kvo::testing {

void slow_copy(const std::uint16_t*, std::uint16_t*, std::size_t, long long, void*) {
  throw Error(ErrorCode::kDevice, "slow_copy needs a build with CUDA");
}

void trap(void*) {
  throw Error(ErrorCode::kDevice, "trap needs a build with CUDA");
}

}  // namespace kvo::testing
