// The CUDA attention kernels alone, against the two ceilings measured in the same run: HBM
// bandwidth (a device-to-device copy) for decode, which reads every K/V byte once, and the bf16
// tensor-core GEMM rate (cuBLAS) for prefill, which is compute bound. The Llama-3-8B shape (32
// query heads, 8 KV heads, head_dim 128, bf16), one layer resident on the device, one slot.
//
//   BM_HbmCopy           bytes/s of a 1 GiB device-to-device copy (read + write)
//   BM_GemmBf16          FLOP/s of an 8192^3 bf16 GEMM with f32 accumulation
//   BM_DecodeAttention   one query row over 4K..128K keys: K/V bytes read per second, and that
//                        over the HBM bandwidth above ("hbm_fraction")
//   BM_PrefillAttention  a 1024-row chunk after 8K..128K keys: FLOP/s, and that over the GEMM
//                        rate above ("gemm_fraction")
//   BM_GgufDecodeQ4K     one decode row through a layer's seven matrices in Q4_K blocks (a
//                        Q4_K_M file's bulk) with the kernel that reads them once: the layer's
//                        time, and its bytes per second over the HBM bandwidth ("hbm_fraction");
//                        bf16 runs only
// Both attention benchmarks run the kernels the decoder would (FlashInfer's where they serve the
// shape; for fp8 and int8 K/V, FlashInfer over dequantized bf16 tiles); --attention=builtin runs
// the built-in ones instead. --kv-dtype=int8 (or fp8) stores the layer as quantized rows; decode's
// bytes are then the quantized ones.
//
//   kvo_bench_attention [--attention=auto|builtin] [--kv-dtype=bf16|f16|fp8|int8]
//                       [--max-context=N] [Google Benchmark flags]
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/cuda/kernels.hpp"
#include "model/decoder/memory_plan.hpp"

namespace kvo::bench {
namespace {

struct Setup {
  bool builtin = false;
  DType kv_dtype = DType::kBF16;
  int max_context = 131072;
  double hbm_bytes_per_s = 0;  // measured by BM_HbmCopy
  double gemm_flop_per_s = 0;  // measured by BM_GemmBf16
};
Setup g_setup;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorCode::kDevice, std::string(what) + ": " + cudaGetErrorString(status));
}

// Device memory freed on scope exit.
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) { check(cudaMalloc(&ptr, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* ptr = nullptr;
};

// Times `work` (enqueued on `stream`) with CUDA events; returns seconds.
template <typename Work>
double time_on(cudaStream_t stream, Work&& work) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  work();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1e-3;
}

void BM_HbmCopy(benchmark::State& state) {
  const std::size_t bytes = 1ull << 30;
  DeviceBuffer a(bytes), b(bytes);
  check(cudaMemset(a.ptr, 1, bytes), "cudaMemset");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  double total = 0;
  for (auto _ : state) {
    const double s = time_on(stream, [&] {
      check(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice, stream), "copy");
    });
    state.SetIterationTime(s);
    total += s;
  }
  cudaStreamDestroy(stream);
  g_setup.hbm_bytes_per_s =
      2.0 * bytes * static_cast<double>(state.iterations()) / total;  // read + write
  state.counters["hbm_bytes_per_s"] = g_setup.hbm_bytes_per_s;
}

void BM_GemmBf16(benchmark::State& state) {
  const int n = 8192;
  const std::size_t elements = static_cast<std::size_t>(n) * n;
  DeviceBuffer a(elements * 2), b(elements * 2), c(elements * 4);
  check(cudaMemset(a.ptr, 0x3c, elements * 2), "cudaMemset");
  check(cudaMemset(b.ptr, 0x3c, elements * 2), "cudaMemset");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cublasHandle_t handle = nullptr;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::kDevice, "cublasCreate");
  cublasSetStream(handle, stream);
  const float one = 1.0f, zero = 0.0f;
  double total = 0;
  for (auto _ : state) {
    const double s = time_on(stream, [&] {
      if (cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.ptr, CUDA_R_16BF, n,
                       b.ptr, CUDA_R_16BF, n, &zero, c.ptr, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        throw Error(ErrorCode::kDevice, "cublasGemmEx");
      }
    });
    state.SetIterationTime(s);
    total += s;
  }
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  g_setup.gemm_flop_per_s =
      2.0 * n * static_cast<double>(n) * n * static_cast<double>(state.iterations()) / total;
  state.counters["flop_per_s"] = g_setup.gemm_flop_per_s;
}

// One decode row through the seven matrices of a Llama-3-8B layer kept in Q4_K blocks (random
// quants, finite scales), each read once by cuda::linear_blocks.
void BM_GgufDecodeQ4K(benchmark::State& state) {
  const model::ModelConfig c = model::preset("llama3-8b");
  const int h = c.hidden_size, kv = static_cast<int>(c.kv_dim()), ff = c.intermediate_size;
  const int shapes[7][2] = {{h, h}, {kv, h}, {kv, h}, {h, h}, {ff, h}, {ff, h}, {h, ff}};
  const std::uint32_t type = model::blocks::kQ4_K;
  const std::size_t block_bytes = static_cast<std::size_t>(model::blocks::block_bytes(type));
  std::size_t bytes = 0;
  std::size_t offsets[7];
  for (int i = 0; i < 7; ++i) {
    offsets[i] = bytes;
    bytes += static_cast<std::size_t>(shapes[i][0]) * (shapes[i][1] / 256) * block_bytes;
  }
  std::vector<std::uint8_t> host(bytes);
  std::uint64_t seed = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < bytes; i += 8) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (std::size_t j = 0; j < 8 && i + j < bytes; ++j)
      host[i + j] = static_cast<std::uint8_t>(seed >> (8 * j));
  }
  for (std::size_t b = 0; b < bytes; b += block_bytes) {  // d and dmin: 2^-10 and 2^-12
    host[b] = 0x00;
    host[b + 1] = 0x14;
    host[b + 2] = 0x00;
    host[b + 3] = 0x0c;
  }
  DeviceBuffer w(bytes), x(sizeof(float) * ff), y(sizeof(float) * ff);
  check(cudaMemcpy(w.ptr, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  std::vector<float> ones(static_cast<std::size_t>(ff), 0.5f);
  check(cudaMemcpy(x.ptr, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  // From pageable memory a copy may return before its DMA lands: done before any kernel reads.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  double total = 0;
  for (auto _ : state) {
    const double s = time_on(stream, [&] {
      for (int i = 0; i < 7; ++i) {
        model::cuda::linear_blocks(static_cast<const float*>(x.ptr), 1, shapes[i][1],
                                   static_cast<const std::uint8_t*>(w.ptr) + offsets[i], type,
                                   shapes[i][0], static_cast<float*>(y.ptr), false, stream);
      }
    });
    state.SetIterationTime(s);
    total += s;
  }
  cudaStreamDestroy(stream);
  const double per_s = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / total;
  state.counters["layer_s"] = total / static_cast<double>(state.iterations());
  state.counters["bytes_per_s"] = per_s;
  if (g_setup.hbm_bytes_per_s > 0) state.counters["hbm_fraction"] = per_s / g_setup.hbm_bytes_per_s;
}

// A one-layer, one-slot cache of `max_seq` tokens of the model's K/V, in the benchmark's dtype.
CacheConfig cache_config(const model::ModelConfig& c, int max_seq) {
  CacheConfig cache;
  cache.layers = 1;
  cache.slots = 1;
  cache.max_seq = max_seq;
  cache.kv_heads = c.kv_heads;
  cache.head_dim = c.head_dim;
  cache.dtype = g_setup.kv_dtype;
  return cache;
}

// One resident layer of `max_seq` tokens (K and V filled with finite bf16 values), the CUDA ops
// over it, and a view of it: what the decoder's attention reads.
class AttentionLayer {
 public:
  AttentionLayer(int max_seq, int max_rows)
      : config_(model::preset("llama3-8b")),
        layout_(config_, DType::kBF16, g_setup.kv_dtype, max_rows, 1, max_seq,
                model::choose_attention_kernels(config_, g_setup.kv_dtype, 1, max_seq, max_rows,
                                                g_setup.builtin)),
        kv_layout_(kv_layout(cache_config(config_, max_seq))),
        kv_(kv_layout_.layer_bytes()),
        workspace_(layout_.bytes),
        rows_(2 * sizeof(std::int32_t)),
        q_(static_cast<std::size_t>(max_rows) * config_.q_dim() * 4),
        out_(static_cast<std::size_t>(max_rows) * config_.q_dim() * 4) {
    // Every byte 0x3c: bf16 0.0115, f16 1.06, fp8 1.5, int8 60, and quantized rows' scales 0.0115.
    check(cudaMemset(kv_.ptr, 0x3c, kv_layout_.layer_bytes()), "cudaMemset");
    check(cudaMemset(q_.ptr, 0, static_cast<std::size_t>(max_rows) * config_.q_dim() * 4),
          "cudaMemset");
    // The memsets run on the legacy stream, which a non-blocking stream's kernels are not
    // ordered after: they are waited for here, before any kernel reads what they wrote.
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    model::OpsShape shape;
    shape.config = config_;
    shape.weight_dtype = DType::kBF16;
    shape.kv_dtype = g_setup.kv_dtype;
    shape.max_rows = max_rows;
    shape.max_decode_rows = 1;
    shape.max_seq = max_seq;
    shape.kernels = layout_.kernels;
    ops_ = model::make_cuda_ops(shape, stream_, workspace_.ptr);
    view_ =
        LayerView::of(kv_layout_, kv_.ptr, static_cast<std::byte*>(kv_.ptr) + kv_layout_.v_begin());
    view_.resident = true;
  }
  ~AttentionLayer() {
    cudaStreamSynchronize(stream_);
    ops_.reset();
    cudaStreamDestroy(stream_);
  }
  AttentionLayer(const AttentionLayer&) = delete;
  AttentionLayer& operator=(const AttentionLayer&) = delete;

  // One decode row at `position` (keys [0, position]).
  double decode(int position) {
    const std::int32_t host_rows[2] = {0, position};
    // On the layer's own stream: the previous call's kernels, still running, read these rows. (A
    // cudaMemcpy on the legacy stream is not ordered after a non-blocking stream's work.) From
    // pageable memory the call returns once host_rows is staged.
    check(cudaMemcpyAsync(rows_.ptr, host_rows, sizeof host_rows, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    model::DecodeRows rows;
    rows.slots = static_cast<const std::int32_t*>(rows_.ptr);
    rows.positions = rows.slots + 1;
    rows.host_slots = host_rows;
    rows.host_positions = host_rows + 1;
    return time_on(stream_, [&] {
      ops_->attention_decode(static_cast<float*>(q_.ptr), 1, rows, config_.sliding_window, view_,
                             static_cast<float*>(out_.ptr));
    });
  }
  // `n` rows at [first, first + n).
  double prefill(int first, int n) {
    return time_on(stream_, [&] {
      ops_->attention_prefill(static_cast<float*>(q_.ptr), n, 0, first, config_.sliding_window,
                              view_, static_cast<float*>(out_.ptr));
    });
  }
  const model::ModelConfig& config() const { return config_; }
  std::string kernels() const { return layout_.kernels.describe(config_, g_setup.kv_dtype); }
  std::uint64_t row_bytes() const { return kv_layout_.k_row_bytes; }

 private:
  model::ModelConfig config_;
  model::WorkspaceLayout layout_;
  KvLayout kv_layout_;  // one slot of max_seq rows in the cache's format
  DeviceBuffer kv_, workspace_, rows_, q_, out_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<model::Ops> ops_;
  LayerView view_;
};

void BM_DecodeAttention(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  AttentionLayer layer(context, 1);
  layer.decode(context - 1);  // warm-up: kernel modules load on first use
  double total = 0;
  for (auto _ : state) {
    const double s = layer.decode(context - 1);
    state.SetIterationTime(s);
    total += s;
  }
  const double bytes = 2.0 * context * static_cast<double>(layer.row_bytes());  // K and V
  const double rate = bytes * static_cast<double>(state.iterations()) / total;
  state.SetLabel(layer.kernels());
  state.counters["context"] = context;
  state.counters["time_s"] = total / static_cast<double>(state.iterations());
  state.counters["kv_bytes_per_s"] = rate;
  if (g_setup.hbm_bytes_per_s > 0) state.counters["hbm_fraction"] = rate / g_setup.hbm_bytes_per_s;
}

void BM_PrefillAttention(benchmark::State& state) {
  const int prefix = static_cast<int>(state.range(0));
  const int chunk = 1024;
  AttentionLayer layer(prefix + chunk, chunk);
  layer.prefill(prefix, chunk);  // warm-up
  double total = 0;
  for (auto _ : state) {
    const double s = layer.prefill(prefix, chunk);
    state.SetIterationTime(s);
    total += s;
  }
  const model::ModelConfig& c = layer.config();
  // Row i attends prefix + i + 1 keys; QK^T and PV each cost 2 flops per multiply-add.
  const double keys = static_cast<double>(chunk) * prefix + chunk * (chunk + 1) / 2.0;
  const double flops = 4.0 * keys * c.heads * c.head_dim;
  const double rate = flops * static_cast<double>(state.iterations()) / total;
  state.SetLabel(layer.kernels());
  state.counters["prefix"] = prefix;
  state.counters["time_s"] = total / static_cast<double>(state.iterations());
  state.counters["flop_per_s"] = rate;
  if (g_setup.gemm_flop_per_s > 0) state.counters["gemm_fraction"] = rate / g_setup.gemm_flop_per_s;
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  try {
    const std::string attention = take_flag(&argc, argv, "attention", "auto");
    if (attention != "auto" && attention != "builtin") {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "--attention takes auto or builtin");
    }
    g_setup.builtin = attention == "builtin";
    g_setup.kv_dtype = kvo::parse_dtype(take_flag(&argc, argv, "kv-dtype", "bf16"));
    if (g_setup.kv_dtype == kvo::DType::kF32) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "--kv-dtype takes bf16, f16, fp8 or int8");
    }
    g_setup.max_context = std::stoi(take_flag(&argc, argv, "max-context", "131072"));
    if (kvo::cuda_device_count() == 0) {
      std::fprintf(stderr, "kvo_bench_attention: needs a CUDA device\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvo_bench_attention: %s\n", e.what());
    return 1;
  }
  benchmark::RegisterBenchmark("BM_HbmCopy", BM_HbmCopy)->UseManualTime()->Iterations(20);
  benchmark::RegisterBenchmark("BM_GemmBf16", BM_GemmBf16)->UseManualTime()->Iterations(20);
  auto* decode = benchmark::RegisterBenchmark("BM_DecodeAttention", BM_DecodeAttention);
  for (int c = 4096; c <= g_setup.max_context; c *= 2) decode->Arg(c);
  decode->ArgName("context")->UseManualTime()->Unit(benchmark::kMicrosecond);
  auto* prefill = benchmark::RegisterBenchmark("BM_PrefillAttention", BM_PrefillAttention);
  for (int c = 8192; c <= g_setup.max_context; c *= 2) prefill->Arg(c);
  prefill->ArgName("prefix")->UseManualTime()->Unit(benchmark::kMillisecond);
  if (g_setup.kv_dtype == kvo::DType::kBF16) {
    benchmark::RegisterBenchmark("BM_GgufDecodeQ4K", BM_GgufDecodeQ4K)
        ->UseManualTime()
        ->Iterations(50)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
