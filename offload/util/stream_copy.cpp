#include "offload/util/stream_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvo::offload {

void copy_streaming_sse2(std::byte* dst, const std::byte* src, std::size_t bytes) {
#if defined(__SSE2__)
  const std::size_t to_boundary = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
  const std::size_t head = to_boundary < bytes ? to_boundary : bytes;
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const auto* from = reinterpret_cast<const __m128i*>(src + i);
    auto* to = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2), d = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

CopyFn copy_streaming() {
#if defined(KVO_HASH_AVX2)
  static const CopyFn copy =
      __builtin_cpu_supports("avx2") ? copy_streaming_avx2 : copy_streaming_sse2;
  return copy;
#else
  return copy_streaming_sse2;
#endif
}

void fence_streaming_stores() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace kvo::offload
