#include "model/host/blas.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "kvoffload/error.hpp"
#include "kvoffload/types.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model::blas {

namespace {

struct Library {
  decltype(&cblas_sgemm) sgemm = nullptr;
  std::string description;
};

// What a core type needs of the CPU, to refuse one it cannot run (OpenBLAS would die of SIGILL).
bool cpu_runs(const std::string& core) {
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (core == "SkylakeX") return avx512;
  if (core == "Cooperlake") return avx512 && __builtin_cpu_supports("avx512bf16");
  // SapphireRapids' sgemm kernels are SkylakeX's (its AMX serves bf16 GEMMs, not called here).
  if (core == "SapphireRapids") return avx512 && __builtin_cpu_supports("avx512bf16");
  if (core == "Haswell" || core == "Zen") return avx2;
  if (core == "Sandybridge") return __builtin_cpu_supports("avx");
  return true;  // SSE3-era kernels, and names left to OpenBLAS to refuse
}

std::string feature_choice(std::string& reason) {
  if (cpu_runs("SkylakeX")) {
    if (__builtin_cpu_supports("avx512bf16")) {
      reason = "chosen for AVX-512 with BF16";
      return "Cooperlake";
    }
    reason = "chosen for AVX-512";
    return "SkylakeX";
  }
  if (cpu_runs("Haswell")) {
    reason = "chosen for AVX2";
    return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  }
  if (cpu_runs("Sandybridge")) {
    reason = "chosen for AVX";
    return "Sandybridge";
  }
  reason = "OpenBLAS's choice: the CPU has no AVX";
  return "";
}

std::string choice(std::string& reason) {
  const char* forced = std::getenv("KVO_BLAS_CORETYPE");
  if (forced != nullptr && forced[0] != '\0') {
    const std::string core = forced;
    if (!cpu_runs(core)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "KVO_BLAS_CORETYPE=" + printable(core) + " names kernels this CPU cannot run");
    }
    reason = "KVO_BLAS_CORETYPE";
    return core;
  }
  return feature_choice(reason);
}

// Sets an environment variable for the lifetime of this object, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value.empty()) {
      ::unsetenv(name);
    } else {
      ::setenv(name, value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

template <typename Fn>
Fn symbol(void* library, const char* name) {
  auto* fn = reinterpret_cast<Fn>(::dlsym(library, name));
  if (fn == nullptr) {
    throw Error(ErrorCode::kInternal, std::string("OpenBLAS lacks ") + name);
  }
  return fn;
}

Library load() {
  std::string reason;
  const std::string core = choice(reason);
  void* library = nullptr;
  std::string tried;
  {
    // OpenBLAS reads both when it loads, and never again.
    const ScopedEnv coretype("OPENBLAS_CORETYPE", core);
    const ScopedEnv threads("OPENBLAS_NUM_THREADS", "1");
    for (const char* path : {KVO_OPENBLAS_LIBRARY, "libopenblas.so.0"}) {
      library = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (library != nullptr) break;
      const char* why = ::dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : path);
    }
  }
  if (library == nullptr) {
    throw Error(ErrorCode::kInternal,
                "cannot load OpenBLAS, which the host path computes its GEMMs with: " + tried +
                    " (Debian: apt-get install libopenblas0-pthread)");
  }
  Library lib;
  lib.sgemm = symbol<decltype(&cblas_sgemm)>(library, "cblas_sgemm");
  const auto get_config = symbol<char* (*)()>(library, "openblas_get_config");
  const auto get_corename = symbol<char* (*)()>(library, "openblas_get_corename");
  const auto set_threads = symbol<void (*)(int)>(library, "openblas_set_num_threads");
  set_threads(1);
  // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64".
  const std::string config = get_config();
  const std::size_t version_end = config.find(' ', config.find(' ') + 1);
  std::string loaded = get_corename();
  if (!loaded.empty()) loaded[0] = static_cast<char>(std::toupper(loaded[0]));
  lib.description = config.substr(0, version_end) + ", " + loaded + " kernels (" + reason + ")";
  return lib;
}

const Library& library() {
  static std::once_flag once;
  static Library lib;
  std::call_once(once, [] { lib = load(); });
  return lib;
}

// /proc/meminfo's field in bytes, or 0.
std::uint64_t meminfo(const char* field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      std::istringstream fields(line.substr(key.size()));
      std::uint64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

// Address space this process maps now (VmSize).
std::uint64_t mapped_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t pages = 0;
  in >> pages;
  return pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

const std::string& description() {
  return library().description;
}

std::string chosen_coretype() {
  std::string reason;
  return choice(reason);
}

void sgemm(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
           int ldb, float beta, float* c, int ldc) {
  library().sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                  a, lda, b, ldb, beta, c, ldc);
}

void check_address_space(int threads, std::uint64_t planned_bytes) {
  const std::uint64_t need = static_cast<std::uint64_t>(threads) * kBufferBytes + planned_bytes;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    const std::uint64_t cap = limit.rlim_cur;
    const std::uint64_t used = mapped_bytes();
    const std::uint64_t room = cap > used ? cap - used : 0;
    if (need > room) {
      throw Error(ErrorCode::kOutOfMemory,
                  "the address-space limit (ulimit -v " + std::to_string(cap / 1024) +
                      " KiB) leaves " + format_bytes(room) + " to map, but this run maps " +
                      format_bytes(need) + " more (" + format_bytes(planned_bytes) +
                      " of plan, and OpenBLAS's buffer of " + format_bytes(kBufferBytes) +
                      " for each of " + std::to_string(threads) + " threads): missing " +
                      format_bytes(need - room) + "; raise the limit or use fewer --threads");
    }
  }
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  if (overcommit >> mode && mode == 2) {
    const std::uint64_t limit_bytes = meminfo("CommitLimit");
    const std::uint64_t committed = meminfo("Committed_AS");
    const std::uint64_t room = limit_bytes > committed ? limit_bytes - committed : 0;
    if (limit_bytes > 0 && need > room) {
      throw Error(ErrorCode::kOutOfMemory,
                  "strict overcommit (vm.overcommit_memory = 2) leaves " + format_bytes(room) +
                      " to commit, but this run maps " + format_bytes(need) +
                      " more (OpenBLAS's buffers of " + format_bytes(kBufferBytes) + " for " +
                      std::to_string(threads) + " threads included): missing " +
                      format_bytes(need - room));
    }
  }
}

}  // namespace kvo::model::blas
