#include "offload/store/host_memory.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "offload/util/checked_math.hpp"

namespace kvo {

std::uint64_t host_available_bytes() {
  if (const char* stated = std::getenv("KVO_HOST_MEMORY"); stated != nullptr && *stated != '\0') {
    try {
      return parse_size(stated);
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("KVO_HOST_MEMORY: ") + e.what() + " (it takes bytes: 96GiB, 4096)");
    }
  }
  std::ifstream in("/proc/meminfo");
  if (!in) return UINT64_MAX;
  std::ostringstream text;
  text << in.rdbuf();
  const offload::MemInfo info = offload::parse_meminfo(text.str());
  if (info.total == 0 && info.available == 0) return UINT64_MAX;
  return offload::available_bytes(info);
}

namespace offload {

MemInfo parse_meminfo(const std::string& text) {
  MemInfo info;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    std::uint64_t kib = 0;
    if (!(fields >> key >> kib) || kib > UINT64_MAX / 1024) continue;
    if (key == "MemTotal:") info.total = kib * 1024;
    if (key == "MemAvailable:") info.available = kib * 1024;
    if (key == "Committed_AS:") info.committed = kib * 1024;
  }
  return info;
}

std::uint64_t available_bytes(const MemInfo& info) {
  const std::uint64_t uncommitted = info.total > info.committed ? info.total - info.committed : 0;
  return std::max(info.available, uncommitted);
}

void require_host_memory(const CachePlan& plan, BackendKind backend, std::uint64_t available) {
  // One of several ranks on a node plans against its share of the node's memory.
  const std::string has = plan.ranks_per_node > 1
                              ? "this rank's share of the node (its available memory / " +
                                    std::to_string(plan.ranks_per_node) + " ranks) is " +
                                    format_bytes(available)
                              : "this machine has " + format_bytes(available) + " available";
  if (backend == BackendKind::kHost) {
    const std::uint64_t need =
        checked_add(plan.device_bytes, plan.host_bytes, "host bytes of the plan");
    if (need <= available) return;
    throw Error(
        ErrorCode::kOutOfMemory,
        "the plan needs " + format_bytes(need) + " of host memory (" +
            format_bytes(plan.device_bytes) +
            " for the device arena, which is host memory on the host backend, and " +
            format_bytes(plan.host_bytes) + " for the KV store) but " + has + ": missing " +
            format_bytes(need - available) +
            ". Lower max_seq or slots (on the host backend, keeping layers resident "
            "does not reduce it), or run on a GPU, where resident layers live in device memory");
  }
  if (plan.host_bytes <= available) return;
  // What would fit: the tokens per slot a store of these streamed layers holds here.
  const KvLayout& l = plan.layout;
  const std::uint64_t per_token = static_cast<std::uint64_t>(plan.streamed_layers) *
                                  static_cast<std::uint64_t>(l.slots) *
                                  (l.k_row_bytes + l.v_row_bytes);
  const std::string longest =
      per_token == 0 ? std::string()
                     : " (here it holds at most " + std::to_string(available / per_token) +
                           " tokens per slot for " + std::to_string(l.slots) + " slot" +
                           (l.slots == 1 ? "" : "s") + ")";
  throw Error(ErrorCode::kOutOfMemory,
              "the pinned host KV store needs " + format_bytes(plan.host_bytes) + " (" +
                  std::to_string(plan.streamed_layers) + " streamed layers) but " + has +
                  ": missing " + format_bytes(plan.host_bytes - available) + longest +
                  ". Keep more layers resident on the device (a larger budget or "
                  "resident_layers), or lower max_seq or slots (on a virtual machine whose memory "
                  "grows as it is used, KVO_HOST_MEMORY states what it can give)");
}

}  // namespace offload
}  // namespace kvo
