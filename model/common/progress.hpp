// Progress of a long piece of work, reported as (units done, units in all): chunks of a prefill,
// tensors of a model being drawn, loaded or written.
#pragma once

#include <cstdint>
#include <functional>

namespace kvo::model {

using ProgressFn = std::function<void(std::int64_t done, std::int64_t total)>;

}  // namespace kvo::model
