// attend_keys_avx512.inc compiled with AVX-512 VNNI, for int8 rows (attend_keys_int8_vnni); the
// other row types stay with attend_keys_avx512.cpp's build, which runs on CPUs without VNNI too.
#include "offload/attend/attend_keys.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVO_KERNEL __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")))
#define KVO_KERNEL_VNNI 1
#include "offload/attend/attend_keys_avx512.inc"

namespace kvo::attend {

KVO_KERNEL void attend_keys_int8_vnni(const float* q, int kv_heads, int group, int d, KeyRows k,
                                      KeyRows v, int keys, SoftmaxState* state, float* acc,
                                      float* kv, float* scores, float softcap) {
  auto* q16 = reinterpret_cast<std::int16_t*>(kv);  // [rows][d]: fits, avx512_vnni_rows says
  round_query(q, kv_heads * group, d, q16, scores);
  attend<DType::kInt8, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap, q16, scores);
}

}  // namespace kvo::attend

#else

namespace kvo::attend {

// Not built for this machine: have_avx512_vnni() says so, and nothing calls the kernel.
void attend_keys_int8_vnni(const float*, int, int, int, KeyRows, KeyRows, int, SoftmaxState*,
                           float*, float*, float*, float) {}

}  // namespace kvo::attend

#endif
