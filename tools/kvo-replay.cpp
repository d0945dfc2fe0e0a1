// kvo-replay: drives an OffloadedStaticCache with synthetic K/V in the step pattern of a model
// shape (one prefill, then decode steps) with no model compute. It checks what every acquire
// exposes against the rows it appended and reports what moved and how long acquire waited:
// "what does my shape move per token, and does the schedule hide it?"
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "tools/cli.hpp"

namespace {

constexpr const char* kUsage = R"(usage: kvo-replay [options]

Shape (defaults: Llama-3-8B's KV shape at 4096 tokens):
  --layers N        decoder layers (32)          --kv-heads N   KV heads (8)
  --head-dim N      head dimension (128)         --dtype T      f32, f16 or bf16 (bf16)
  --max-seq N       tokens per slot (4096)       --slots N      sequences (1)
Steps:
  --prompt N        prefill tokens per slot (max-seq - steps)
  --steps N         decode steps after the prefill (8)
Cache:
  --resident N|auto layers kept on the device (0); auto: as many as --vram-budget holds
  --ring D          staging buffers (2)
  --vram-budget S   device budget, e.g. 24GiB (none)
  --backend B       auto, cuda or host (auto)
  --delays          host backend: random copy delays up to --max-delay-us (50)
  --seed N          seed of the synthetic rows and delays (1)
Checks and output:
  --verify MODE     full (every valid row at every acquire), sample (first, last and 8 random
                    rows per slot), off (full)
  --json            print one JSON object as the last line
)";

// splitmix64: the synthetic content of a row is a pure function of where it belongs.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct RowSource {
  std::uint64_t seed;
  int slots;
  int max_seq;
  std::size_t row_bytes;

  // Fills `count` rows of tensor kv (0 = K, 1 = V) of `layer`/`slot` starting at `token`.
  void fill(int layer, int kv, int slot, int token, int count, std::uint8_t* out) const {
    for (int r = 0; r < count; ++r) {
      const std::uint64_t key =
          ((static_cast<std::uint64_t>(layer) * 2 + static_cast<std::uint64_t>(kv)) *
               static_cast<std::uint64_t>(slots) +
           static_cast<std::uint64_t>(slot)) *
              static_cast<std::uint64_t>(max_seq) +
          static_cast<std::uint64_t>(token + r);
      std::uint64_t state = mix(seed ^ mix(key));
      std::uint8_t* row = out + static_cast<std::size_t>(r) * row_bytes;
      for (std::size_t b = 0; b < row_bytes; b += 8) {
        state = mix(state);
        const std::size_t take = row_bytes - b < 8 ? row_bytes - b : 8;
        std::memcpy(row + b, &state, take);
      }
    }
  }
};

struct Options {
  kvo::CacheConfig config;
  int prompt = 0;
  int steps = 8;
  std::string verify = "full";
  bool json = false;
  std::uint64_t seed = 1;
};

Options parse(int argc, char** argv) {
  const kvo::cli::Args args(
      argc, argv,
      {"layers", "kv-heads", "head-dim", "max-seq", "slots", "prompt", "steps", "resident", "ring",
       "dtype", "backend", "seed", "vram-budget", "max-delay-us", "verify"},
      {"delays", "json", "help"});
  if (args.has("help")) {
    std::cout << kUsage;
    std::exit(0);
  }
  Options o;
  kvo::CacheConfig& c = o.config;
  constexpr std::int64_t kMax = 1 << 30;
  c.layers = static_cast<int>(args.get_int("layers", 32, 1, 4096));
  c.kv_heads = static_cast<int>(args.get_int("kv-heads", 8, 1, 4096));
  c.head_dim = static_cast<int>(args.get_int("head-dim", 128, 1, 65536));
  c.max_seq = static_cast<int>(args.get_int("max-seq", 4096, 1, kMax));
  c.slots = static_cast<int>(args.get_int("slots", 1, 1, 65536));
  c.dtype = kvo::parse_dtype(args.get("dtype", "bf16"));
  c.backend = kvo::parse_backend(args.get("backend", "auto"));
  c.ring_depth = static_cast<int>(args.get_int("ring", 2, 1, 64));
  const std::string resident = args.get("resident", "0");
  c.resident_layers = resident == "auto"
                          ? kvo::kAutoResidentLayers
                          : static_cast<int>(args.get_int("resident", 0, 0, c.layers));
  if (args.has("vram-budget")) c.device_budget = kvo::parse_size(args.get("vram-budget", ""));
  o.seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, INT64_MAX));
  if (args.has("delays")) {
    c.host.max_delay_us = static_cast<std::uint32_t>(args.get_int("max-delay-us", 50, 0, 1000000));
    c.host.delay_seed = o.seed;
  }
  o.steps = static_cast<int>(args.get_int("steps", 8, 0, kMax));
  if (o.steps > c.max_seq) {
    throw kvo::cli::UsageError("--steps (" + std::to_string(o.steps) + ") exceeds --max-seq (" +
                               std::to_string(c.max_seq) + ")");
  }
  o.prompt = static_cast<int>(args.get_int("prompt", c.max_seq - o.steps, 0, c.max_seq));
  if (static_cast<std::int64_t>(o.prompt) + o.steps > c.max_seq) {
    throw kvo::cli::UsageError("--prompt + --steps (" + std::to_string(o.prompt + o.steps) +
                               ") exceeds --max-seq (" + std::to_string(c.max_seq) + ")");
  }
  o.verify = args.get("verify", "full");
  if (o.verify != "full" && o.verify != "sample" && o.verify != "off") {
    throw kvo::cli::UsageError("--verify must be full, sample or off, got '" + o.verify + "'");
  }
  o.json = args.has("json");
  return o;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Replay {
 public:
  explicit Replay(Options options)
      : o_(std::move(options)),
        row_bytes_(static_cast<std::size_t>(o_.config.kv_heads) * o_.config.head_dim *
                   kvo::dtype_size(o_.config.dtype)),
        max_rows_(std::max(o_.prompt, 1)),
        source_{o_.seed, o_.config.slots, o_.config.max_seq, row_bytes_} {
    // The rows handed to append live in device memory planned with the cache.
    o_.config.reserved.push_back({"append_rows", 2 * max_rows_ * row_bytes_});
    cache_ = std::make_unique<kvo::OffloadedStaticCache>(o_.config);
    input_ = static_cast<std::uint8_t*>(cache_->reserved("append_rows"));
    stream_ = cache_->backend() == kvo::BackendKind::kCuda ? cache_->create_stream() : nullptr;
    host_rows_.resize(2 * max_rows_ * row_bytes_);
    // Verification reads a whole valid prefix at once.
    expected_.resize(static_cast<std::size_t>(o_.config.max_seq) * row_bytes_);
    actual_.resize(expected_.size());
  }
  ~Replay() {
    if (cache_ && stream_ != nullptr) cache_->destroy_stream(stream_);
  }

  // One step: every slot appends `n` rows to every layer. Returns false on a mismatch.
  bool step(int n) {
    const int slots = o_.config.slots;
    cache_->begin_step(std::vector<std::int32_t>(static_cast<std::size_t>(slots), n));
    for (int layer = 0; layer < o_.config.layers; ++layer) {
      const kvo::LayerView view = cache_->acquire(layer, stream_);
      if (o_.verify != "off" && !check(view)) return false;
      for (int s = 0; s < slots; ++s) {
        if (n == 0) continue;
        cache_->synchronize_stream(stream_);  // the previous append has read the input rows
        source_.fill(layer, 0, s, view.lengths[s], n, host_rows_.data());
        source_.fill(layer, 1, s, view.lengths[s], n, host_rows_.data() + max_rows_ * row_bytes_);
        cache_->copy_to_device(input_, host_rows_.data(), 2 * max_rows_ * row_bytes_);
        cache_->append(layer, s, input_, input_ + max_rows_ * row_bytes_, n, stream_);
      }
      cache_->release(layer, stream_);
    }
    cache_->end_step();
    return true;
  }

  int run() {
    const auto start = Clock::now();
    bool ok = step(o_.prompt);
    const double prefill_s = seconds_since(start);
    const kvo::CacheStats after_prefill = cache_->stats();
    const auto decode_start = Clock::now();
    for (int i = 0; ok && i < o_.steps; ++i) ok = step(1);
    cache_->synchronize();
    const double decode_s = seconds_since(decode_start);
    report(ok, prefill_s, decode_s, after_prefill);
    return ok ? 0 : 1;
  }

 private:
  bool check(const kvo::LayerView& view) {
    cache_->synchronize_stream(stream_);
    for (int s = 0; s < view.slots; ++s) {
      const int len = view.lengths[s];
      if (len == 0) continue;
      std::vector<int> rows;
      if (o_.verify == "full") {
        rows.push_back(-1);  // the whole prefix at once
      } else {
        std::mt19937 draw(static_cast<unsigned>(o_.seed + static_cast<std::uint64_t>(view.layer)));
        rows = {0, len - 1};
        for (int r = 0; r < 8; ++r) rows.push_back(static_cast<int>(draw() % len));
      }
      for (int kv = 0; kv < 2; ++kv) {
        const auto* base = static_cast<const std::uint8_t*>(kv == 0 ? view.k : view.v);
        for (int row : rows) {
          const int first = row < 0 ? 0 : row;
          const int count = row < 0 ? len : 1;
          const std::size_t bytes = static_cast<std::size_t>(count) * row_bytes_;
          const std::size_t offset =
              (static_cast<std::size_t>(s) * view.max_seq + static_cast<std::size_t>(first)) *
              row_bytes_;
          cache_->copy_to_host(actual_.data(), base + offset, bytes);
          source_.fill(view.layer, kv, s, first, count, expected_.data());
          if (std::memcmp(actual_.data(), expected_.data(), bytes) != 0) {
            std::cerr << "kvo-replay: MISMATCH at step " << cache_->stats().steps << ", layer "
                      << view.layer << ", slot " << s << ", " << (kv == 0 ? "K" : "V") << " rows ["
                      << first << ", " << first + count << ")\n";
            return false;
          }
        }
      }
    }
    return true;
  }

  void report(bool ok, double prefill_s, double decode_s, const kvo::CacheStats& prefill) {
    const kvo::CacheStats st = cache_->stats();
    const kvo::CachePlan& p = st.plan;
    std::uint64_t context = 0;
    for (int s = 0; s < o_.config.slots; ++s)
      context += static_cast<std::uint64_t>(cache_->length(s));
    // The performance model: every streamed layer's valid prefix, K and V, once per step.
    const std::uint64_t last_context =
        context - static_cast<std::uint64_t>(o_.steps > 0 ? o_.config.slots : 0);
    const std::uint64_t expected_h2d =
        o_.steps > 0 ? 2ull * p.streamed_layers * last_context * p.row_bytes : 0;
    const std::uint64_t decode_h2d = st.h2d_bytes_total - prefill.h2d_bytes_total;
    const double step_s = o_.steps > 0 ? decode_s / o_.steps : 0.0;
    const double h2d_gbps = decode_s > 0 ? static_cast<double>(decode_h2d) / decode_s * 1e-9 : 0;
    const bool bytes_ok = o_.steps == 0 || st.h2d_bytes_last_step == expected_h2d;
    const bool verified = ok && bytes_ok && o_.verify != "off";

    std::printf(
        "kvo-replay  %d layers x %d kv heads x %d head_dim (%s), %d slot(s), max_seq %d, "
        "backend %s\n",
        o_.config.layers, o_.config.kv_heads, o_.config.head_dim, kvo::dtype_name(o_.config.dtype),
        o_.config.slots, o_.config.max_seq, kvo::backend_name(cache_->backend()));
    std::printf("  plan            %d resident + %d streamed layers, ring %d; device %s, host %s\n",
                p.resident_layers, p.streamed_layers, p.ring_depth,
                kvo::format_bytes(p.device_bytes).c_str(), kvo::format_bytes(p.host_bytes).c_str());
    std::printf("  prefill         %d tokens/slot in %.3f s\n", o_.prompt, prefill_s);
    std::printf("  decode          %d steps, %.3f ms/step\n", o_.steps, step_s * 1e3);
    std::printf("  last step       H2D %s (model: %s), D2H %s\n",
                kvo::format_bytes(st.h2d_bytes_last_step).c_str(),
                kvo::format_bytes(expected_h2d).c_str(),
                kvo::format_bytes(st.d2h_bytes_last_step).c_str());
    std::printf("  total           H2D %s, D2H %s; decode H2D at %.2f GB/s\n",
                kvo::format_bytes(st.h2d_bytes_total).c_str(),
                kvo::format_bytes(st.d2h_bytes_total).c_str(), h2d_gbps);
    std::printf("  acquire waited  %.6f s in total\n", st.acquire_wait_s);
    std::printf("  verified        %s%s\n",
                o_.verify == "off" ? "no (--verify off)" : (ok ? "yes" : "NO: contents differ"),
                bytes_ok ? "" : "; H2D bytes differ from the model");
    if (o_.json) {
      std::printf(
          "{\"verified\":%s,\"verify\":\"%s\",\"backend\":\"%s\",\"layers\":%d,\"kv_heads\":%d,"
          "\"head_dim\":%d,\"dtype\":\"%s\",\"max_seq\":%d,\"slots\":%d,\"prompt\":%d,"
          "\"steps\":%d,\"resident_layers\":%d,\"ring_depth\":%d,"
          "\"h2d_bytes_last_step\":%llu,\"d2h_bytes_last_step\":%llu,"
          "\"h2d_bytes_total\":%llu,\"d2h_bytes_total\":%llu,\"model_h2d_bytes_per_step\":%llu,"
          "\"acquire_wait_s\":%.9f,\"planned_device_bytes\":%llu,\"host_bytes\":%llu,"
          "\"prefill_s\":%.6f,\"decode_step_s\":%.9f,\"decode_h2d_GBps\":%.4f}\n",
          verified ? "true" : "false", o_.verify.c_str(), kvo::backend_name(cache_->backend()),
          o_.config.layers, o_.config.kv_heads, o_.config.head_dim,
          kvo::dtype_name(o_.config.dtype), o_.config.max_seq, o_.config.slots, o_.prompt, o_.steps,
          p.resident_layers, p.ring_depth, static_cast<unsigned long long>(st.h2d_bytes_last_step),
          static_cast<unsigned long long>(st.d2h_bytes_last_step),
          static_cast<unsigned long long>(st.h2d_bytes_total),
          static_cast<unsigned long long>(st.d2h_bytes_total),
          static_cast<unsigned long long>(expected_h2d), st.acquire_wait_s,
          static_cast<unsigned long long>(p.device_bytes),
          static_cast<unsigned long long>(p.host_bytes), prefill_s, step_s, h2d_gbps);
    }
  }

  Options o_;
  std::size_t row_bytes_;
  std::size_t max_rows_;
  RowSource source_;
  std::unique_ptr<kvo::OffloadedStaticCache> cache_;
  std::uint8_t* input_ = nullptr;
  void* stream_ = nullptr;
  std::vector<std::uint8_t> host_rows_, expected_, actual_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    Replay replay(parse(argc, argv));
    return replay.run();
  } catch (const kvo::cli::UsageError& e) {
    std::cerr << "kvo-replay: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const kvo::Error& e) {
    std::cerr << "kvo-replay: " << e.what() << "\n";
    return 1;
  }
}
