// Which BLAS the host path uses, decided by measurement: sgemm on the model's GEMM shapes (a
// 512-token prefill chunk of the tiny preset and of SmolLM2-135M, and decode rows) through each
// library found, loaded at run time so that both run in one process, each two ways: the library's
// own threads (set to --threads), or single-threaded calls on --threads of our threads, each
// computing a band of output columns (how model/host/host_linear.cpp calls it).
//
//   kvo_bench_blas_compare [--threads=N] [--libs=path1,path2] [Google Benchmark flags]
//
// Default libraries: Debian's OpenBLAS and BLIS pthread builds. Counter: GFLOPs (rate).
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.hpp"

namespace kvo::bench {
namespace {

// cblas_sgemm(layout, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                       float, float*, int);
using SetThreads = void (*)(int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Library {
  std::string path;
  Sgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
};

struct Shape {
  const char* name;
  int m, n, k;  // y [m][n] = x [m][k] W^T, W [n][k]
};
const Shape kShapes[] = {
    {"tiny_q", 512, 256, 256},     {"tiny_kv", 512, 64, 256},     {"tiny_gate", 512, 688, 256},
    {"tiny_down", 512, 256, 688},  {"smol_q", 512, 576, 576},     {"smol_kv", 512, 192, 576},
    {"smol_gate", 512, 1536, 576}, {"smol_down", 512, 576, 1536}, {"smol_head_1row", 1, 49152, 576},
};

int g_threads = 2;
std::vector<Library> g_libraries;

void BM_Sgemm(benchmark::State& state, const Library* lib, Shape s, bool own_threads) {
  lib->set_threads(own_threads ? 1 : g_threads);
  std::vector<float> x(static_cast<std::size_t>(s.m) * s.k, 0.5f);
  std::vector<float> w(static_cast<std::size_t>(s.n) * s.k, 0.25f);
  std::vector<float> y(static_cast<std::size_t>(s.m) * s.n);
  auto band = [&](int n0, int n1) {
    lib->sgemm(kRowMajor, kNoTrans, kTrans, s.m, n1 - n0, s.k, 1.0f, x.data(), s.k,
               w.data() + static_cast<std::size_t>(n0) * s.k, s.k, 0.0f, y.data() + n0, s.n);
  };
  for (auto _ : state) {
    if (!own_threads) {
      band(0, s.n);
    } else {
      // Bands of whole 16-column groups, one per thread, the caller taking the first.
      std::vector<std::thread> others;
      const int per = (s.n / g_threads + 15) / 16 * 16;
      for (int t = 1; t < g_threads; ++t) {
        const int n0 = std::min(s.n, t * per),
                  n1 = t + 1 == g_threads ? s.n : std::min(s.n, (t + 1) * per);
        if (n0 < n1) others.emplace_back([&, n0, n1] { band(n0, n1); });
      }
      band(0, std::min(s.n, per));
      for (auto& o : others) o.join();
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k * 1e-9 * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  g_threads = std::max(1, std::stoi(take_flag(&argc, argv, "threads", "2")));
  std::stringstream libs(take_flag(&argc, argv, "libs",
                                   "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0,"
                                   "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"));
  for (std::string path; std::getline(libs, path, ',');) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      std::fprintf(stderr, "kvo_bench_blas_compare: skipping %s: %s\n", path.c_str(), dlerror());
      continue;
    }
    Library lib;
    lib.path = path;
    lib.sgemm = reinterpret_cast<Sgemm>(dlsym(handle, "cblas_sgemm"));
    lib.set_threads = reinterpret_cast<SetThreads>(dlsym(handle, "openblas_set_num_threads"));
    if (lib.set_threads == nullptr) {
      lib.set_threads = reinterpret_cast<SetThreads>(dlsym(handle, "bli_thread_set_num_threads"));
    }
    if (lib.sgemm == nullptr || lib.set_threads == nullptr) {
      std::fprintf(stderr, "kvo_bench_blas_compare: %s has no cblas_sgemm or thread setter\n",
                   path.c_str());
      continue;
    }
    g_libraries.push_back(lib);
  }
  for (const Library& lib : g_libraries) {
    const std::string name = lib.path.find("blis") != std::string::npos ? "blis" : "openblas";
    for (const Shape& s : kShapes) {
      for (bool own : {false, true}) {
        benchmark::RegisterBenchmark(
            (name + "/" + s.name + (own ? "/our_threads" : "/blas_threads")).c_str(), BM_Sgemm,
            &lib, s, own)
            ->UseRealTime();
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return g_libraries.empty() ? 1 : 0;
}
