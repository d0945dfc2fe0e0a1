#include "offload/util/host_pages.hpp"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvo {

void* allocate_host_pages(std::size_t bytes, std::size_t alignment) {
  const bool huge = bytes >= kHugePageBytes;
  void* ptr = nullptr;
  if (posix_memalign(&ptr, huge ? kHugePageBytes : alignment, bytes) != 0) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: a kernel without transparent huge pages refuses it and keeps small pages.
  if (huge) static_cast<void>(::madvise(ptr, bytes, MADV_HUGEPAGE));
#endif
  return ptr;
}

}  // namespace kvo
