// attend_keys written with AVX-512 intrinsics, for CPUs that have it (picked at run time): the
// kernel's body is attend_keys_avx512.inc, compiled here without VNNI; int8 rows go to its VNNI
// build (attend_keys_vnni.cpp) where the CPU has that.
#include "offload/attend/attend_keys.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVO_KERNEL __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
#define KVO_KERNEL_VNNI 0
#include "offload/attend/attend_keys_avx512.inc"

namespace kvo::attend {

KVO_KERNEL void attend_keys_avx512(const float* q, int kv_heads, int group, int d, KeyRows k,
                                   KeyRows v, int keys, SoftmaxState* state, float* acc, float* kv,
                                   float* scores, float softcap) {
  const int rows = kv_heads * group;
  if (avx512_vnni_rows(k.type, d, group)) {
    attend_keys_int8_vnni(q, kv_heads, group, d, k, v, keys, state, acc, kv, scores, softcap);
    return;
  }
  if (avx512_vbmi_rows(k.type)) {
    attend_keys_fp8_vbmi(q, kv_heads, group, d, k, v, keys, state, acc, kv, scores, softcap);
    return;
  }
  // bf16 rows of whole 64s, with q's rows fitting kv's scratch: paired (q and acc laid out so
  // for the call; acc back in order at its end).
  if (avx512_pairs(k.type, d, group)) {
    to_pairs(q, rows, d, kv);
    to_pairs(acc, rows, d, acc);
    attend<DType::kBF16, true>(kv, kv_heads, group, d, k, v, keys, state, acc, softcap);
    from_pairs(acc, rows, d);
    return;
  }
  // f32, f16, bf16, int8 and fp8 rows
  visit(
      k.type,
      [&](auto t) {
        constexpr auto kType = static_cast<DType>(decltype(t)::value);
        if constexpr (kType == DType::kF32 || kType == DType::kF16 || kType == DType::kInt8 ||
                      kType == DType::kFP8E4M3) {
          attend<kType, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap);
        } else {
          attend<DType::kBF16, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap);
        }
      },
      [] {});
}

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return yes;
}

bool have_avx512_vnni() {
  static const bool yes = have_avx512() && __builtin_cpu_supports("avx512vnni");
  return yes;
}

bool have_avx512_vbmi() {
  static const bool yes = have_avx512() && __builtin_cpu_supports("avx512vbmi");
  return yes;
}

}  // namespace kvo::attend

#else

namespace kvo::attend {

// Not built for this machine: have_avx512() says so, and nothing calls the kernel.
void attend_keys_avx512(const float*, int, int, int, KeyRows, KeyRows, int, SoftmaxState*, float*,
                        float*, float*, float) {}

bool have_avx512() {
  return false;
}

bool have_avx512_vnni() {
  return false;
}

bool have_avx512_vbmi() {
  return false;
}

}  // namespace kvo::attend

#endif
