// Host memory for large buffers that are read front to back (the K/V store, a layer's rows on the
// host backend): blocks of 2 MiB and more start on a 2 MiB boundary and are advised to the kernel
// as transparent huge pages (MADV_HUGEPAGE; a kernel set to "madvise" grants them only so). Decode
// attention over 4 KiB pages walks a page table for every 4 KiB of each of K and V, and once a
// layer's GEMMs have pushed those tables out of the caches the walks go to memory: on a 2-core
// Xeon VM the int8 host attention over 32K keys ran 1.22x as fast over 2 MiB pages
// (bench/results/host-attention-9258dcf-2m.json and -4k.json, docs/kvo-generate.md). Where huge
// pages are off, or refused, the memory is ordinary pages.
#pragma once

#include <cstddef>

namespace kvo {

constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// `bytes` (> 0) aligned to `alignment` (a power of two, at most 4096), or 2 MiB and advised as
// huge pages where bytes >= 2 MiB; nullptr when the memory cannot be had. Free with std::free.
void* allocate_host_pages(std::size_t bytes, std::size_t alignment);

}  // namespace kvo
