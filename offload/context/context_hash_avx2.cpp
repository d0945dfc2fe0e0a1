// XXH3's streaming update compiled for AVX2, for the checksums of saved contexts (XXH3's result
// does not depend on the instructions it runs, and with SSE2 alone hashing takes about a third of
// a restore's time); context_file.cpp picks it where the CPU has AVX2. The restore's other loop,
// the streaming copy, is offload/util/stream_copy_avx2.cpp.
#define XXH_INLINE_ALL  // every XXH function static here: none clashes with the SSE2 build's
#include <immintrin.h>
#include <xxhash.h>

#include <cstddef>

namespace kvo::offload {

void xxh3_update_avx2(void* state, const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, bytes);
}

}  // namespace kvo::offload
