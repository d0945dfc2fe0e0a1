// The host path's thread pool is the one split attention's host part runs on
// (offload/attend/thread_pool.hpp), by the names the model's code uses.
#pragma once

#include "offload/attend/thread_pool.hpp"

namespace kvo::model {

using attend::available_cores;
using attend::ThreadPool;

}  // namespace kvo::model
