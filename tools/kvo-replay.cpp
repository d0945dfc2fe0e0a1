// kvo-replay: drives an OffloadedStaticCache with synthetic K/V in the step pattern of a model
// shape (one prefill, then decode steps) with no model compute. It checks what every acquire
// exposes against the rows it appended and reports what moved and how long acquire waited:
// "what does my shape move per token, and does the schedule hide it?"
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"

namespace {

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
  int prompt = -1;  // -1: max_seq - steps
  int piece = 0;    // the prompt prefilled in steps of at most this many rows; 0: one step
  int steps = 8;
  std::string verify = "full";
  bool json = false;
  std::uint64_t seed = 1;
  // As given on the command line, resolved by finish().
  std::string resident = "0";
  std::string dtype = "bf16";
  std::string backend = "auto";
  std::uint64_t vram_budget = 0;
  bool delays = false;
  int max_delay_us = 50;
  // Split attention (CacheConfig::split, kAuto): the two rates, in GB/s; 0: no split.
  double pcie_gbps = 0;
  double host_gbps = 0;
  double split_fixed_us = 0;  // the model's fixed cost of a split layer (query out, parts in)
  bool model_only = false;
};

// Every option, declared once.
void declare_options(CLI::App& app, Options& o) {
  kvo::cli::describe(app,
                     "Drives kvoffload's cache with synthetic K/V in a model's step pattern (one "
                     "prefill, then decode steps) without model compute, checks every acquired "
                     "view against the rows appended, and reports what moved.");
  using kvo::cli::add_integer;
  kvo::CacheConfig& c = o.config;
  constexpr int kMax = 1 << 30;
  c.layers = 32, c.kv_heads = 8, c.head_dim = 128, c.max_seq = 4096, c.slots = 1;
  app.option_defaults()->group("Shape (default: Llama-3-8B's KV shape at 4096 tokens)");
  add_integer(app, "--layers", c.layers, 1, 4096, "decoder layers");
  add_integer(app, "--kv-heads", c.kv_heads, 1, 4096, "KV heads");
  add_integer(app, "--head-dim", c.head_dim, 1, 65536, "head dimension");
  kvo::cli::add_choice(app, "--dtype", o.dtype, kvo::dtype_names(),
                       "element type (fp8 and int8: quantized rows, one f32 scale per token and "
                       "kv head)");
  kvo::cli::add_tokens(app, "--max-seq", c.max_seq, 1, kMax, "tokens per slot");
  add_integer(app, "--slots", c.slots, 1, 65536, "sequences");
  app.option_defaults()->group("Steps");
  kvo::cli::add_tokens(app, "--prompt", o.prompt, 0, kMax, "")
      ->description("prefill tokens per slot (default: --max-seq - --steps)");
  kvo::cli::add_tokens(app, "--piece", o.piece, 1, kMax, "")
      ->description(
          "prefill the prompt in steps of at most this many tokens, each re-reading "
          "the rows before it (default: one step)");
  kvo::cli::add_tokens(app, "--steps", o.steps, 0, kMax, "decode steps after the prefill");
  app.option_defaults()->group("Cache");
  kvo::cli::add_text(app, "--resident", o.resident, "N|auto",
                     "layers kept on the device (default 0); auto: as many as --vram-budget "
                     "holds");
  add_integer(app, "--ring", c.ring_depth, 1, 64, "staging buffers");
  kvo::cli::add_size(app, "--vram-budget", o.vram_budget, 1, "device budget, e.g. 24GiB (none)");
  kvo::cli::add_choice(app, "--backend", o.backend, {"auto", "cuda", "host"},
                       "who moves the bytes (auto: cuda when there is a GPU)");
  kvo::cli::add_flag(app, "--delays", o.delays,
                     "host backend: random copy delays up to --max-delay-us");
  add_integer(app, "--max-delay-us", o.max_delay_us, 0, 1000000, "the longest random delay");
  add_integer(app, "--seed", o.seed, 0, UINT64_MAX, "seed of the synthetic rows and delays");
  app.option_defaults()->group("Split attention (a model of the step, and the bytes it moves)");
  kvo::cli::add_real(app, "--pcie-gbps", o.pcie_gbps, 0, 1e6,
                     "host-to-device rate, GB/s: with --host-attention-gbps, decode steps split "
                     "each streamed layer where the two rates balance, and the report models the "
                     "step split and unsplit");
  kvo::cli::add_real(app, "--host-attention-gbps", o.host_gbps, 0, 1e6,
                     "the host's attention over rows in place, GB/s");
  kvo::cli::add_real(app, "--split-fixed-us", o.split_fixed_us, 0, 1e6,
                     "the model's fixed cost per split layer, microseconds: the query to the host, "
                     "its partial output back, the merge (default 0)");
  kvo::cli::add_flag(app, "--model-only", o.model_only,
                     "print the plan and the modelled step without allocating or running");
  app.option_defaults()->group("Checks and output");
  kvo::cli::add_choice(app, "--verify", o.verify, {"full", "sample", "off"},
                       "full: every valid row at every acquire; sample: first, last and 8 "
                       "random rows per slot");
  kvo::cli::add_flag(app, "--json", o.json, "print one JSON object as the last line");
}

// What the options mean together; throws kvo::cli::UsageError.
Options finish(Options o) {
  kvo::CacheConfig& c = o.config;
  c.dtype = kvo::parse_dtype(o.dtype);
  c.backend = kvo::parse_backend(o.backend);
  if (o.resident == "auto") {
    c.resident_layers = kvo::kAutoResidentLayers;
  } else {
    std::int64_t n = 0;
    if (!kvo::cli::read_integer(o.resident, n) || n < 0 || n > c.layers) {
      throw kvo::cli::UsageError("--resident needs auto or a layer count from 0 to " +
                                 std::to_string(c.layers) + " (--layers), got '" +
                                 kvo::printable(o.resident) + "'");
    }
    c.resident_layers = static_cast<int>(n);
  }
  c.device_budget = o.vram_budget;
  if (o.delays) {
    c.host.max_delay_us = static_cast<std::uint32_t>(o.max_delay_us);
    c.host.delay_seed = o.seed;
  }
  if (o.steps > c.max_seq) {
    throw kvo::cli::UsageError("--steps (" + std::to_string(o.steps) + ") exceeds --max-seq (" +
                               std::to_string(c.max_seq) + ")");
  }
  if ((o.pcie_gbps > 0) != (o.host_gbps > 0)) {
    throw kvo::cli::UsageError("--pcie-gbps and --host-attention-gbps go together (both > 0)");
  }
  if (o.pcie_gbps > 0) {
    c.split.mode = kvo::SplitMode::kAuto;
    c.split.h2d_bytes_per_s = o.pcie_gbps * 1e9;
    c.split.host_bytes_per_s = o.host_gbps * 1e9;
  }
  if (o.prompt < 0) o.prompt = c.max_seq - o.steps;
  if (static_cast<std::int64_t>(o.prompt) + o.steps > c.max_seq) {
    throw kvo::cli::UsageError("--prompt + --steps (" + std::to_string(o.prompt + o.steps) +
                               ") exceeds --max-seq (" + std::to_string(c.max_seq) + ")");
  }
  return o;
}

// The modelled decode step at `length` rows per slot: unsplit, every streamed layer's rows cross
// the bus; split, a layer's tail crosses while the host attends the rows before the split, so a
// layer costs the slower of the two plus the fixed cost of the split. Compute is left out
// (hidden behind the bus, or the same in both). Prints both and returns the split's speedup.
struct StepModel {
  double unsplit_s = 0;
  double split_s = 0;
  std::int64_t split_row = 0;
  std::uint64_t bus_bytes = 0;  // per step, split
};
StepModel model_step(const Options& o, const kvo::CachePlan& p, int length) {
  StepModel m;
  const double slots = o.config.slots;
  const double row = 2.0 * static_cast<double>(p.row_bytes);  // K and V
  const double pcie = o.pcie_gbps * 1e9, host = o.host_gbps * 1e9;
  m.split_row = kvo::split_rows(o.config.split, length);
  const double tail = row * slots * static_cast<double>(length - m.split_row);
  const double head = row * slots * static_cast<double>(m.split_row);
  m.unsplit_s = p.streamed_layers * row * slots * length / pcie;
  m.split_s = p.streamed_layers * (std::max(tail / pcie, head / host) + o.split_fixed_us * 1e-6);
  m.bus_bytes = static_cast<std::uint64_t>(p.streamed_layers * tail);
  return m;
}
void print_model(const Options& o, const StepModel& m, int length) {
  std::printf(
      "  split model     at %d rows: %lld on the host, %lld over the bus; decode step %.1f ms "
      "unsplit (bus at %.0f GB/s) vs %.1f ms split (host at %.0f GB/s, %.0f us fixed per "
      "layer): %.2fx\n",
      length, static_cast<long long>(m.split_row), static_cast<long long>(length - m.split_row),
      m.unsplit_s * 1e3, o.pcie_gbps, m.split_s * 1e3, o.host_gbps, o.split_fixed_us,
      m.unsplit_s / m.split_s);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Replay {
 public:
  explicit Replay(Options options)
      : o_(std::move(options)),
        row_bytes_(static_cast<std::size_t>(
            kvo::kv_row_bytes(o_.config.dtype, o_.config.kv_heads, o_.config.head_dim))),
        max_rows_(std::max(o_.piece > 0 ? std::min(o_.piece, o_.prompt) : o_.prompt, 1)),
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

  // One step: every slot appends `n` rows to every layer; a prefill step never splits (a piece
  // of one row neither: its split rows are given, none). Returns false on a mismatch.
  bool step(int n, bool decode) {
    const auto slots = static_cast<std::size_t>(o_.config.slots);
    if (decode) {
      cache_->begin_step(std::vector<std::int32_t>(slots, n));
    } else {
      cache_->begin_step(std::vector<std::int32_t>(slots, n), std::vector<std::int32_t>(slots, 0));
    }
    for (int layer = 0; layer < o_.config.layers; ++layer) {
      const kvo::LayerView view = cache_->acquire(layer, stream_);
      if (o_.verify != "off" && !check(view)) return false;
      for (int s = 0; s < o_.config.slots; ++s) {
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

  // True when every view held what was appended and the bytes moved match the model.
  bool run() {
    const auto start = Clock::now();
    bool ok = true;
    const int piece = o_.piece > 0 ? o_.piece : std::max(o_.prompt, 1);
    for (int done = 0; ok && done < o_.prompt; done += piece) {
      ok = step(std::min(piece, o_.prompt - done), false);
    }
    if (o_.prompt == 0) ok = step(0, false);
    const double prefill_s = seconds_since(start);
    const kvo::CacheStats after_prefill = cache_->stats();
    const auto decode_start = Clock::now();
    for (int i = 0; ok && i < o_.steps; ++i) ok = step(1, true);
    cache_->synchronize();
    const double decode_s = seconds_since(decode_start);
    return report(ok, prefill_s, decode_s, after_prefill);
  }

 private:
  bool check(const kvo::LayerView& view) {
    cache_->synchronize_stream(stream_);
    for (int s = 0; s < view.layout.slots; ++s) {
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
      // Under a split, rows before it are read where the host attends them: the host store.
      const int split = view.split_rows != nullptr ? view.split_rows[s] : 0;
      for (int kv = 0; kv < 2; ++kv) {
        const auto* base = static_cast<const std::uint8_t*>(kv == 0 ? view.k : view.v);
        const auto* host = static_cast<const std::uint8_t*>(kv == 0 ? view.host_k : view.host_v);
        for (int row : rows) {
          const int first = row < 0 ? 0 : row;
          const int count = row < 0 ? len : 1;
          const std::size_t bytes = static_cast<std::size_t>(count) * row_bytes_;
          const std::size_t offset = (static_cast<std::size_t>(s) * view.layout.max_seq +
                                      static_cast<std::size_t>(first)) *
                                     row_bytes_;
          const std::size_t host_rows =
              static_cast<std::size_t>(std::max(0, std::min(split, first + count) - first));
          if (host_rows > 0) std::memcpy(actual_.data(), host + offset, host_rows * row_bytes_);
          if (host_rows * row_bytes_ < bytes) {
            cache_->copy_to_host(actual_.data() + host_rows * row_bytes_,
                                 base + offset + host_rows * row_bytes_,
                                 bytes - host_rows * row_bytes_);
          }
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

  bool report(bool ok, double prefill_s, double decode_s, const kvo::CacheStats& prefill) {
    const kvo::CacheStats st = cache_->stats();
    const kvo::CachePlan& p = st.plan;
    std::uint64_t context = 0;
    for (int s = 0; s < o_.config.slots; ++s)
      context += static_cast<std::uint64_t>(cache_->length(s));
    // The performance model: every streamed layer's valid prefix, K and V, once per step.
    const std::uint64_t last_context =
        context - static_cast<std::uint64_t>(o_.steps > 0 ? o_.config.slots : 0);
    // Split: each slot's rows before the split stay on the host (the step before guessed the
    // split of this one exactly: one row longer, the config's rule).
    const int last_length =
        static_cast<int>(last_context / static_cast<std::uint64_t>(o_.config.slots));
    const std::uint64_t split_rows_total =
        o_.steps > 0 ? static_cast<std::uint64_t>(kvo::split_rows(o_.config.split, last_length)) *
                           static_cast<std::uint64_t>(o_.config.slots)
                     : 0;
    std::uint64_t expected_h2d =
        o_.steps > 0 ? 2ull * p.streamed_layers * (last_context - split_rows_total) * p.row_bytes
                     : 0;
    if (o_.steps == 1) {
      // The first decode step: its first layers were prefetched whole during the prefill.
      const auto whole = static_cast<std::uint64_t>(std::min(p.ring_depth, p.streamed_layers));
      expected_h2d += 2ull * whole * split_rows_total * p.row_bytes;
    }
    const std::uint64_t decode_h2d = st.h2d_bytes_total - prefill.h2d_bytes_total;
    const double step_s = o_.steps > 0 ? decode_s / o_.steps : 0.0;
    const double h2d_gbps = decode_s > 0 ? static_cast<double>(decode_h2d) / decode_s * 1e-9 : 0;
    // The prefill: each piece's streamed layers bring the rows before it, and the last piece
    // prefetches the first layers of the next step (as many as the ring holds) whole.
    std::uint64_t rows_before = 0;
    const int piece = o_.piece > 0 ? o_.piece : std::max(o_.prompt, 1);
    for (int start = piece; start < o_.prompt; start += piece) {
      rows_before += static_cast<std::uint64_t>(start);
    }
    const std::uint64_t per_row = 2ull * p.row_bytes * static_cast<std::uint64_t>(o_.config.slots);
    const std::uint64_t expected_prefill_h2d =
        per_row * (static_cast<std::uint64_t>(p.streamed_layers) * rows_before +
                   static_cast<std::uint64_t>(std::min(p.ring_depth, p.streamed_layers)) *
                       static_cast<std::uint64_t>(o_.prompt));
    const bool bytes_ok = (o_.steps == 0 || st.h2d_bytes_last_step == expected_h2d) &&
                          prefill.h2d_bytes_total == expected_prefill_h2d;
    const bool verified = ok && bytes_ok && o_.verify != "off";

    std::printf(
        "kvo-replay  %d layers x %d kv heads x %d head_dim (%s), %d slot(s), max_seq %d, "
        "backend %s\n",
        o_.config.layers, o_.config.kv_heads, o_.config.head_dim, kvo::dtype_name(o_.config.dtype),
        o_.config.slots, o_.config.max_seq, kvo::backend_name(cache_->backend()));
    std::printf("  plan            %d resident + %d streamed layers, ring %d; device %s, host %s\n",
                p.resident_layers, p.streamed_layers, p.ring_depth,
                kvo::format_bytes(p.device_bytes).c_str(), kvo::format_bytes(p.host_bytes).c_str());
    std::printf("  prefill         %d tokens/slot in %d step(s) in %.3f s; H2D %s (model: %s)\n",
                o_.prompt, o_.prompt == 0 ? 1 : (o_.prompt + piece - 1) / piece, prefill_s,
                kvo::format_bytes(prefill.h2d_bytes_total).c_str(),
                kvo::format_bytes(expected_prefill_h2d).c_str());
    std::printf("  decode          %d steps, %.3f ms/step\n", o_.steps, step_s * 1e3);
    std::printf("  last step       H2D %s (model: %s), D2H %s\n",
                kvo::format_bytes(st.h2d_bytes_last_step).c_str(),
                kvo::format_bytes(expected_h2d).c_str(),
                kvo::format_bytes(st.d2h_bytes_last_step).c_str());
    std::printf("  total           H2D %s, D2H %s; decode H2D at %.2f GB/s\n",
                kvo::format_bytes(st.h2d_bytes_total).c_str(),
                kvo::format_bytes(st.d2h_bytes_total).c_str(), h2d_gbps);
    std::printf("  acquire waited  %.6f s in total\n", st.acquire_wait_s);
    if (o_.pcie_gbps > 0) print_model(o_, model_step(o_, p, last_length), last_length);
    std::printf("  verified        %s%s\n",
                o_.verify == "off" ? "no (--verify off)" : (ok ? "yes" : "NO: contents differ"),
                bytes_ok ? "" : "; H2D bytes differ from the model");
    if (o_.json) {
      nlohmann::ordered_json j;
      j["verified"] = verified;
      j["verify"] = o_.verify;
      j["backend"] = kvo::backend_name(cache_->backend());
      j["layers"] = o_.config.layers;
      j["kv_heads"] = o_.config.kv_heads;
      j["head_dim"] = o_.config.head_dim;
      j["dtype"] = kvo::dtype_name(o_.config.dtype);
      j["max_seq"] = o_.config.max_seq;
      j["slots"] = o_.config.slots;
      j["prompt"] = o_.prompt;
      j["piece"] = piece;
      j["prefill_h2d_bytes"] = prefill.h2d_bytes_total;
      j["model_prefill_h2d_bytes"] = expected_prefill_h2d;
      j["steps"] = o_.steps;
      j["resident_layers"] = p.resident_layers;
      j["ring_depth"] = p.ring_depth;
      j["h2d_bytes_last_step"] = st.h2d_bytes_last_step;
      j["d2h_bytes_last_step"] = st.d2h_bytes_last_step;
      j["h2d_bytes_total"] = st.h2d_bytes_total;
      j["d2h_bytes_total"] = st.d2h_bytes_total;
      j["model_h2d_bytes_per_step"] = expected_h2d;
      j["acquire_wait_s"] = st.acquire_wait_s;
      j["planned_device_bytes"] = p.device_bytes;
      j["host_bytes"] = p.host_bytes;
      j["prefill_s"] = prefill_s;
      j["decode_step_s"] = step_s;
      j["decode_h2d_GBps"] = h2d_gbps;
      if (o_.pcie_gbps > 0) {
        const StepModel m = model_step(o_, p, last_length);
        j["split_row"] = m.split_row;
        j["model_step_unsplit_s"] = m.unsplit_s;
        j["model_step_split_s"] = m.split_s;
        j["model_split_speedup"] = m.unsplit_s / m.split_s;
      }
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return ok && bytes_ok;
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
  CLI::App app("", "kvo-replay");
  Options options;
  declare_options(app, options);
  return kvo::cli::run(app, argc, argv, [&] {
    const Options o = finish(options);
    if (o.model_only) {
      // The plan and the model alone: nothing allocated.
      const kvo::CachePlan p = kvo::plan_cache(o.config, o.config.device_budget);
      const int length = std::max(o.prompt + o.steps - 1, 0);
      std::printf(
          "kvo-replay  %d layers x %d kv heads x %d head_dim (%s), %d slot(s), model only\n",
          o.config.layers, o.config.kv_heads, o.config.head_dim, kvo::dtype_name(o.config.dtype),
          o.config.slots);
      std::printf(
          "  plan            %d resident + %d streamed layers, %s of K and V per token "
          "per layer\n",
          p.resident_layers, p.streamed_layers, kvo::format_bytes(2 * p.row_bytes).c_str());
      if (o.pcie_gbps > 0) {
        print_model(o, model_step(o, p, length), length);
      } else {
        std::printf("  (give --pcie-gbps and --host-attention-gbps for the split model)\n");
      }
      return kvo::cli::kExitSuccess;
    }
    Replay replay(o);
    return replay.run() ? kvo::cli::kExitSuccess : kvo::cli::kExitFailure;
  });
}
