// The CUDA path's entry points in a build without CUDA: the decoder only reaches them when the
// cache runs on a GPU, which such a build never does.
#include "kvoffload/error.hpp"
#include "model/cuda/cuda_ops.hpp"

namespace kvo::model {
namespace {
[[noreturn]] void unavailable() {
  throw Error(ErrorCode::kDevice, "kvoffload was built without CUDA");
}
}  // namespace

std::unique_ptr<Ops> make_cuda_ops(const OpsShape&, void*, void*) {
  unavailable();
}
std::uint64_t cuda_device_bytes_in_use() {
  return 0;
}

std::uint64_t cuda_default_budget() {
  return 0;
}

}  // namespace kvo::model
