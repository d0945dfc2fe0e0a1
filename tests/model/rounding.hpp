// Float32's unit roundoff, and Higham's gamma_n = n u / (1 - n u): the relative error of a sum or
// dot product of n terms, in any order of summation (any kernel, blocked or not, FMA or not). The
// model tests derive their bounds from them, operation by operation.
#pragma once

#include <cstdint>

namespace kvo::model::testing {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

inline double gamma(std::int64_t n) {
  return static_cast<double>(n) * kU / (1 - static_cast<double>(n) * kU);
}

}  // namespace kvo::model::testing
