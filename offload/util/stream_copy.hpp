// Copies that write their destination around the cache (streaming stores), for restored rows:
// they are written once and read much later, and ordinary stores would first read every
// destination line in, a third stream of memory traffic beside reading the source and writing the
// rows.
#pragma once

#include <cstddef>

namespace kvo::offload {

// dst [bytes] = src [bytes]: streaming stores from dst's first 16-byte boundary on (SSE2; a plain
// copy where there is no SSE2), the bytes before it and the tail copied plainly. Any alignment.
void copy_streaming_sse2(std::byte* dst, const std::byte* src, std::size_t bytes);
#if defined(KVO_HASH_AVX2)
// The same with 32-byte streaming stores (stream_copy_avx2.cpp). REQUIRES: the CPU has AVX2.
void copy_streaming_avx2(std::byte* dst, const std::byte* src, std::size_t bytes);
#endif

// The widest of them this CPU runs.
using CopyFn = void (*)(std::byte* dst, const std::byte* src, std::size_t bytes);
CopyFn copy_streaming();

// Orders the calling thread's streaming stores before what it does next; a thread calls it before
// another may read what it copied (a join then publishes the rows).
void fence_streaming_stores();

}  // namespace kvo::offload
