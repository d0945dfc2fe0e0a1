// XXH3's streaming update compiled for AVX2, for the checksums of saved contexts: XXH3's result
// does not depend on the instructions it runs, and with SSE2 alone hashing takes about a third
// of a restore's time. context_file.cpp calls it where the CPU has AVX2.
#define XXH_INLINE_ALL  // every XXH function static here: none clashes with the SSE2 build's
#include <xxhash.h>

#include <cstddef>

namespace kvo::offload {

void xxh3_update_avx2(void* state, const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, bytes);
}

}  // namespace kvo::offload
