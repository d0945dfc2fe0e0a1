// Host decode attention alone, against this machine's memory read bandwidth measured in the same
// run: one query row of a Llama-3-8B-shaped layer (8 KV heads, head_dim 128, GQA 4) over 4K, 32K
// and 128K keys, on the host path's thread pool; K/V rows of each of --types (each benchmark's
// label names the rows and the kernel that ran; its `rows` argument is the type's index in
// kRowTypes: 0 bf16, 1 int8, 2 f16, 3 f32, 4 fp8). Each iteration times one attention
// (the iteration time) and, just after, a plain streaming read of the same K and V bytes by the
// same pool (64-bit adds, no compute): both see the same machine load. Before each of the two, an
// untimed read of a buffer of 4x the last-level cache evicts what the other left there, so
// both start from memory: otherwise the read finds in the cache the tail the attention just
// touched (a quarter of the bytes at 32K), and the comparison favours whichever runs second.
//
//   kvo_bench_host_attention [--threads=N] [--contexts=4096,32768,131072]
//                            [--types=bf16,int8,f16,f32,fp8] [--pages=2m|4k]
//                            [Google Benchmark flags]
//
// K and V lie where the host store puts them (offload/util/host_pages.hpp): on 2 MiB pages where
// the kernel grants them (--pages=2m, the default), or on 4 KiB pages (--pages=4k, advised
// MADV_NOHUGEPAGE; what every run before the host store took huge pages measured). The label
// says which. Both the attention and the streaming read see the same pages.
//
// Split attention's host side too: BM_SplitHostPart (the rows before a split of 32K and 128K
// rows, on 1 thread and on --threads, 0: every core) and BM_SplitFixedCost (what splitting a
// layer adds on the host backend, beside the unsplit attention over the same keys).
//
// Counters: bytes_per_second (K/V bytes read by attention per second), read_bytes_per_second
// (the streaming read), fraction_of_read (their ratio; the target is >= 0.85 from 32K up).
#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/common/numerics.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/host_ops.hpp"
#include "model/host/thread_pool.hpp"
#include "offload/util/host_pages.hpp"

namespace kvo::bench {
namespace {

int g_threads = 0;
bool g_huge_pages = true;  // --pages
// The row types, in the order of the `rows` argument (bf16 and int8 first, as earlier runs named
// them 0 and 1).
constexpr DType kRowTypes[] = {DType::kBF16, DType::kInt8, DType::kF16, DType::kF32,
                               DType::kFP8E4M3};

// Bytes of the largest data cache this process sees (sysconf), 32 MiB when it does not say.
std::size_t last_level_cache_bytes() {
  long bytes = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes > 0 ? static_cast<std::size_t>(bytes) : std::size_t{32} << 20;
}

// Reads every line of `buffer` on the pool: whatever was cached before is evicted, and what
// replaces it is clean, so no write-back falls into the next timed region.
void evict_caches(model::ThreadPool& pool, const std::vector<std::uint64_t>& buffer) {
  const int tasks = pool.threads() * 4;
  const std::size_t per = buffer.size() / static_cast<std::size_t>(tasks);
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(tasks), 0);
  pool.run(tasks, [&](int task, int) {
    const std::uint64_t* p = buffer.data() + static_cast<std::size_t>(task) * per;
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < per; i += 8) sum += p[i];
    sums[static_cast<std::size_t>(task)] = sum;
  });
  benchmark::DoNotOptimize(sums.data());
}

// Sums `region_bytes` of each region as 64-bit words over the pool, one 1 MiB block per task.
std::uint64_t streaming_read(model::ThreadPool& pool, const std::vector<const void*>& regions,
                             std::size_t region_bytes) {
  constexpr std::size_t kBlock = 1 << 20;
  const std::size_t blocks_per_region = (region_bytes + kBlock - 1) / kBlock;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(pool.threads()) * 8, 0);
  pool.run(static_cast<int>(blocks_per_region * regions.size()), [&](int task, int thread) {
    const auto* base = static_cast<const std::uint64_t*>(
        regions[static_cast<std::size_t>(task) / blocks_per_region]);
    const std::size_t first = (static_cast<std::size_t>(task) % blocks_per_region) * kBlock / 8;
    const std::size_t last = std::min(first + kBlock / 8, region_bytes / 8);
    std::uint64_t acc[8] = {};
    for (std::size_t i = first; i + 8 <= last; i += 8) {
      for (int j = 0; j < 8; ++j) acc[j] += base[i + j];
    }
    for (int j = 0; j < 8; ++j) sums[static_cast<std::size_t>(thread) * 8] += acc[j];
  });
  std::uint64_t total = 0;
  for (auto s : sums) total += s;
  return total;
}

// Zeroed bytes on the pages --pages names.
class PageBuffer {
 public:
  explicit PageBuffer(std::size_t bytes) : bytes_(bytes) {
    void* p = nullptr;
    if (g_huge_pages) {
      p = allocate_host_pages(bytes, 64);
    } else if (posix_memalign(&p, 4096, bytes) == 0) {
#ifdef MADV_NOHUGEPAGE
      static_cast<void>(::madvise(p, bytes, MADV_NOHUGEPAGE));
#endif
    } else {
      p = nullptr;
    }
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<std::byte*>(p);
    std::memset(data_, 0, bytes);
  }
  ~PageBuffer() {
    std::free(data_);
  }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  std::byte* data() const {
    return data_;
  }
  std::size_t size() const {
    return bytes_;
  }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_;
};

std::string pages_label() {
  return g_huge_pages ? ", 2 MiB pages" : ", 4 KiB pages";
}

// K and V of one slot, [context][kv_heads][head_dim] rows of `type` (f32, f16 and bf16 rows
// rounded from, int8 and fp8 rows quantized from, the same random values); their view.
struct TypedLayer {
  KvLayout layout;
  PageBuffer k, v;
  LayerView view;
  static KvLayout layout_of(const model::ModelConfig& c, int context, DType type) {
    CacheConfig cache;
    cache.layers = 1;
    cache.max_seq = context;
    cache.kv_heads = c.kv_heads;
    cache.head_dim = c.head_dim;
    cache.dtype = type;
    return kv_layout(cache);
  }
  TypedLayer(const model::ModelConfig& c, int context, DType type)
      : layout(layout_of(c, context, type)), k(layout.k_tensor_bytes), v(layout.v_tensor_bytes) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const std::size_t row = static_cast<std::size_t>(c.kv_heads) * c.head_dim;
    std::vector<float> values(row);
    for (PageBuffer* tensor : {&k, &v}) {
      for (int t = 0; t < context; ++t) {
        for (auto& x : values) x = dist(rng);
        std::byte* at = tensor->data() + static_cast<std::size_t>(t) * layout.k_row_bytes;
        if (is_quantized(type)) {
          quantize_row(values.data(), c.kv_heads, c.head_dim, type, at);
        } else {
          visit(
              type,
              [&](auto tag) {
                constexpr auto kType = decltype(tag)::value;
                for (std::size_t e = 0; e < row; ++e) {
                  model::store_as<kType>(at, static_cast<std::int64_t>(e), values[e]);
                }
              },
              [] {});
        }
      }
    }
    view = LayerView::of(layout, k.data(), v.data());
  }
  std::size_t bytes() const { return k.size() + v.size(); }
};

// Range(1): the rows' type, an index into kRowTypes (quantized rows' scales included in the
// bytes).
void BM_HostDecodeAttention(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  const DType type = kRowTypes[state.range(1)];
  const model::ModelConfig c = model::preset("llama3-8b");  // 32/8 heads, head_dim 128
  model::ThreadPool pool(g_threads > 0 ? g_threads : model::available_cores());
  model::HostAttention attention(c, type, 1, pool);
  const TypedLayer layer(c, context, type);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(c.q_dim())), out(q.size());
  for (auto& x : q) x = dist(rng);
  const std::int32_t slot = 0, position = context - 1;
  const std::size_t bytes = layer.bytes();
  const std::vector<const void*> regions = {layer.k.data(), layer.v.data()};

  attention.decode(q.data(), 1, &slot, &position, 0, layer.view, out.data());  // warm-up
  std::vector<std::uint64_t> evict(4 * last_level_cache_bytes() / sizeof(std::uint64_t), 1);
  double attention_seconds = 0, read_seconds = 0;
  std::uint64_t sink = 0;
  for (auto _ : state) {
    evict_caches(pool, evict);
    const auto start = Clock::now();
    attention.decode(q.data(), 1, &slot, &position, 0, layer.view, out.data());
    const double seconds = seconds_since(start);
    state.SetIterationTime(seconds);
    attention_seconds += seconds;
    benchmark::DoNotOptimize(out.data());
    evict_caches(pool, evict);
    const auto read_start = Clock::now();
    sink += streaming_read(pool, regions, bytes / 2);
    read_seconds += seconds_since(read_start);
  }
  benchmark::DoNotOptimize(sink);
  const double total = static_cast<double>(bytes) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(total));
  state.counters["read_bytes_per_second"] = total / read_seconds;
  state.counters["fraction_of_read"] = read_seconds / attention_seconds;
  state.counters["kv_bytes"] = static_cast<double>(bytes);
  state.counters["threads"] = pool.threads();
  state.SetLabel(std::string(dtype_name(type)) + " rows, kernel " + attention.decode_kernel() +
                 pages_label());
}

// Split attention's host part (model/host/host_attention.hpp, KeyRange): one query row over the
// rows before a split of `rows` rows, with its log-sum-exp, on 1 thread and on every core: the
// rate of the host side, which bounds the split (bytes_per_second_per_thread).
void BM_SplitHostPart(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  const int threads =
      state.range(1) > 0 ? static_cast<int>(state.range(1)) : model::available_cores();
  const model::ModelConfig c = model::preset("llama3-8b");
  model::ThreadPool pool(threads);
  model::HostAttention attention(c, kvo::DType::kBF16, 1, pool);
  const TypedLayer layer(c, rows + 1, kvo::DType::kBF16);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(c.q_dim())), out(q.size());
  std::vector<float> lse(static_cast<std::size_t>(c.heads));
  for (auto& x : q) x = dist(rng);
  const std::int32_t slot = 0, position = rows, end = rows;
  model::HostAttention::KeyRange range;
  range.end = &end;
  range.lse = lse.data();
  std::vector<std::uint64_t> evict(4 * last_level_cache_bytes() / sizeof(std::uint64_t), 1);
  double seconds = 0;
  for (auto _ : state) {
    evict_caches(pool, evict);
    const auto start = Clock::now();
    attention.decode(q.data(), 1, &slot, &position, 0, layer.view, out.data(), range);
    const double s = seconds_since(start);
    state.SetIterationTime(s);
    seconds += s;
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes = static_cast<double>(layer.bytes()) * rows / (rows + 1);
  const double total = bytes * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(total));
  state.counters["bytes_per_second_per_thread"] = total / seconds / threads;
  state.counters["threads"] = threads;
  state.SetLabel("bf16 rows" + pages_label());
}

// The fixed cost of splitting one layer on the host backend: attention_decode_split against
// attention_decode over the same 256 keys (split at 128), timed alternately in one loop; the
// difference is the second pass's set-up and the merge (fixed_cost_us). On CUDA the query's copy
// out and the partial's copy in add to it.
void BM_SplitFixedCost(benchmark::State& state) {
  const model::ModelConfig c = model::preset("llama3-8b");
  model::OpsShape shape;
  shape.config = c;
  shape.weight_dtype = kvo::DType::kBF16;
  shape.kv_dtype = kvo::DType::kBF16;
  shape.max_rows = 1;
  shape.max_decode_rows = 1;
  shape.max_seq = 257;
  shape.threads = g_threads > 0 ? g_threads : model::available_cores();
  model::HostOps ops(shape);
  const TypedLayer layer(c, 257, kvo::DType::kBF16);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(c.q_dim())), out(q.size());
  for (auto& x : q) x = dist(rng);
  const std::int32_t slot = 0, position = 256, split = 128;
  model::DecodeRows rows;
  rows.host_slots = &slot;
  rows.host_positions = &position;
  LayerView view = layer.view;
  view.split_rows = &split;
  view.host_k = layer.view.k;
  view.host_v = layer.view.v;
  double split_s = 0, whole_s = 0;
  for (auto _ : state) {
    auto start = Clock::now();
    ops.attention_decode_split(q.data(), 1, rows, 0, view, out.data());
    const double s = seconds_since(start);
    state.SetIterationTime(s);
    split_s += s;
    start = Clock::now();
    ops.attention_decode(q.data(), 1, rows, 0, layer.view, out.data());
    whole_s += seconds_since(start);
    benchmark::DoNotOptimize(out.data());
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["fixed_cost_us"] = (split_s - whole_s) / n * 1e6;
  state.counters["unsplit_us"] = whole_s / n * 1e6;
  state.counters["threads"] = shape.threads;
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  std::vector<std::int64_t> contexts, types;
  try {
    g_threads = std::stoi(take_flag(&argc, argv, "threads", "0"));
    const std::string pages = take_flag(&argc, argv, "pages", "2m");
    if (pages != "2m" && pages != "4k") throw std::invalid_argument("--pages takes 2m or 4k");
    g_huge_pages = pages == "2m";
    std::stringstream list(take_flag(&argc, argv, "contexts", "4096,32768,131072"));
    for (std::string item; std::getline(list, item, ',');) contexts.push_back(std::stoll(item));
    std::stringstream names(take_flag(&argc, argv, "types", "bf16,int8,f16,f32,fp8"));
    for (std::string item; std::getline(names, item, ',');) {
      const kvo::DType type = kvo::parse_dtype(item);
      const auto* at = std::find(std::begin(kRowTypes), std::end(kRowTypes), type);
      types.push_back(at - std::begin(kRowTypes));
    }
    if (types.empty()) throw std::invalid_argument("--types names no row type");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvo_bench_host_attention: %s\n", e.what());
    return 2;
  }
  for (std::int64_t context : contexts) {
    auto* bench = benchmark::RegisterBenchmark("BM_HostDecodeAttention", BM_HostDecodeAttention);
    for (std::int64_t type : types) bench->Args({context, type});
    bench->ArgNames({"context", "rows"})->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (std::int64_t rows : {32768, 131072}) {
    for (std::int64_t threads : {std::int64_t{1}, std::int64_t{g_threads}}) {
      benchmark::RegisterBenchmark("BM_SplitHostPart", BM_SplitHostPart)
          ->Args({rows, threads})
          ->ArgNames({"rows", "threads"})
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("BM_SplitFixedCost", BM_SplitFixedCost)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
