// The host path's BLAS: OpenBLAS, loaded at first use with the kernels this file chooses for the
// CPU, so that the GEMMs use what the CPU has whatever the environment says and whatever the
// installed OpenBLAS knows about the CPU.
//
// Why not let OpenBLAS choose: it picks kernels at load time from a table of CPU models, and
// Debian's 0.3.21 does not know newer ones; on a Sapphire Rapids-class Xeon (AVX-512 with BF16)
// it falls back to its Prescott (SSE3) kernels. An environment's OPENBLAS_CORETYPE can also pin
// older kernels than the CPU has. So the library is not linked: it is dlopen'ed once, with
// OPENBLAS_CORETYPE set for that moment to the kernels chosen from the CPU's features:
//   AVX-512 F/BW/DQ/VL (and the OS saving its state): SkylakeX, or Cooperlake with AVX512_BF16;
//   AVX2 and FMA: Zen on AMD, Haswell on others;   AVX: Sandybridge;   else OpenBLAS's choice.
// KVO_BLAS_CORETYPE=<OpenBLAS core name> (Prescott, Haswell, SkylakeX, ...) chooses instead: for
// tests and for comparing kernels; a name this CPU cannot run is refused. OPENBLAS_NUM_THREADS is
// set to 1 for the load too: the host path runs single-threaded BLAS calls on its own pool, and
// OpenBLAS then starts no threads of its own.
//
// OpenBLAS keeps a buffer of address space per calling thread (kBufferBytes, mostly never
// touched); when it cannot map one it retries forever. check_address_space() refuses a run whose
// address-space limit (ulimit -v) or strict overcommit leaves no room for them, before the run.
#pragma once

#include <cstdint>
#include <string>

namespace kvo::model::blas {

// OpenBLAS 0.3.21's per-thread buffer on x86-64 (BUFFER_SIZE, 32 << 22), and a margin for what
// else a thread maps: what each thread that calls BLAS needs of address space.
inline constexpr std::uint64_t kBufferBytes = std::uint64_t{128} << 20;

// "OpenBLAS 0.3.21, SkylakeX kernels (chosen for AVX-512)"; loads the library if need be.
// Throws kvo::Error(kInvalidArgument) when KVO_BLAS_CORETYPE names kernels this CPU cannot run,
// and kvo::Error(kInternal) when OpenBLAS cannot be loaded.
const std::string& description();

// The kernels chosen for this CPU and environment, as OpenBLAS names them ("" for OpenBLAS's own
// choice), without loading anything.
std::string chosen_coretype();

// C = alpha A op(B) + beta C, row-major, single-threaded on the calling thread. trans_b: B^T.
void sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc);

// Refuses (kvo::Error kOutOfMemory, naming the bytes) when `threads` BLAS buffers cannot be
// mapped on top of `planned_bytes` more: under RLIMIT_AS, or under strict overcommit
// (vm.overcommit_memory = 2) the commit limit.
void check_address_space(int threads, std::uint64_t planned_bytes);

}  // namespace kvo::model::blas
