// Tests that need a GPU skip where there is none, unless KVO_REQUIRE_CUDA=1 says a GPU must be
// there (tools/device-check.sh sets it): then a missing GPU is a failure, so a broken device
// setup can never pass as a run of skipped tests. A CUDA setup that is present but broken (a
// driver too old for the runtime, say) fails either way: cuda_device_count throws.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "kvoffload/types.hpp"

namespace kvo::testing {

inline bool cuda_required() {
  const char* value = std::getenv("KVO_REQUIRE_CUDA");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace kvo::testing

// At the top of a test that needs a CUDA device.
#define KVO_SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                                 \
    if (::kvo::cuda_device_count() == 0) {                                             \
      if (::kvo::testing::cuda_required()) {                                           \
        FAIL() << "KVO_REQUIRE_CUDA=1, but there is no CUDA device (or this build of " \
                  "kvoffload has no CUDA)";                                            \
      }                                                                                \
      GTEST_SKIP() << "no CUDA device";                                                \
    }                                                                                  \
  } while (false)
