// attend_keys_avx512.inc compiled with AVX-512 VBMI, for fp8 (e4m3) rows (attend_keys_fp8_vbmi):
// each byte becomes its f32 through two 128-byte tables and byte permutes. The other row types
// stay with attend_keys_avx512.cpp's build, which runs on CPUs without VBMI too.
#include "offload/attend/attend_keys.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVO_KERNEL __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,fma,f16c")))
#define KVO_KERNEL_VNNI 0
#define KVO_KERNEL_VBMI 1
#include "offload/attend/attend_keys_avx512.inc"

namespace kvo::attend {

KVO_KERNEL void attend_keys_fp8_vbmi(const float* q, int kv_heads, int group, int d, KeyRows k,
                                     KeyRows v, int keys, SoftmaxState* state, float* acc, float*,
                                     float*, float softcap) {
  attend<DType::kFP8E4M3, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap);
}

}  // namespace kvo::attend

#else

namespace kvo::attend {

// Not built for this machine: have_avx512_vbmi() says so, and nothing calls the kernel.
void attend_keys_fp8_vbmi(const float*, int, int, int, KeyRows, KeyRows, int, SoftmaxState*, float*,
                          float*, float*, float) {}

}  // namespace kvo::attend

#endif
