// A random engine for the cache: steps (prefills, decodes, chunked appends, idle slots), resets
// and truncations, run in lockstep on several caches and checked at every acquire against a
// host-side reference of what every layer and slot must hold.
//
// On the host backend, checks run as host functions on the caller's stream, so with an
// asynchronous stream and random delays they read the staging buffer long after release()
// returned: a prefetch that did not wait for the caller would be caught. On CUDA they run after
// a stream synchronize, through copy_to_host.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace kvo::testing {

// Reference contents: rows[layer][kv][slot] holds max_seq rows of row_bytes each.
class Reference {
 public:
  Reference(int layers, int slots, int max_seq, std::size_t row_bytes)
      : slots_(slots),
        max_seq_(max_seq),
        row_bytes_(row_bytes),
        rows_(static_cast<std::size_t>(layers) * 2 * slots,
              std::vector<std::uint8_t>(static_cast<std::size_t>(max_seq) * row_bytes)) {}
  std::uint8_t* row(int layer, int kv, int slot, int token) {
    return rows_[(static_cast<std::size_t>(layer) * 2 + kv) * slots_ + slot].data() +
           static_cast<std::size_t>(token) * row_bytes_;
  }
  std::size_t row_bytes() const { return row_bytes_; }
  // Slot s takes slot source[s]'s rows, every layer and tensor (reorder_slots).
  void reorder(const std::vector<int>& source) {
    const std::size_t layers_kv = rows_.size() / static_cast<std::size_t>(slots_);
    for (std::size_t lk = 0; lk < layers_kv; ++lk) {
      std::vector<std::vector<std::uint8_t>> before(
          rows_.begin() + static_cast<std::ptrdiff_t>(lk * slots_),
          rows_.begin() + static_cast<std::ptrdiff_t>((lk + 1) * slots_));
      for (int s = 0; s < slots_; ++s) {
        rows_[lk * slots_ + static_cast<std::size_t>(s)] =
            before[static_cast<std::size_t>(source[static_cast<std::size_t>(s)])];
      }
    }
  }

 private:
  int slots_;
  int max_seq_;
  std::size_t row_bytes_;
  std::vector<std::vector<std::uint8_t>> rows_;
};

// A comparison of `rows` rows of one slot of a view against the reference, run on a stream.
struct CheckTask {
  const std::uint8_t* actual = nullptr;
  const std::uint8_t* expected = nullptr;
  std::size_t bytes = 0;
  std::atomic<int>* failures = nullptr;
  static void run(void* arg) {
    auto* task = static_cast<CheckTask*>(arg);
    if (std::memcmp(task->actual, task->expected, task->bytes) != 0) task->failures->fetch_add(1);
  }
};

class CacheUnderTest {
 public:
  CacheUnderTest(CacheConfig config, bool async_stream, std::size_t max_append_bytes)
      : config_(std::move(config)) {
    config_.reserved.push_back({"inputs", 2 * max_append_bytes});
    cache_ = std::make_unique<OffloadedStaticCache>(config_);
    cuda_ = cache_->backend() == BackendKind::kCuda;
    if (async_stream || cuda_) stream_ = cache_->create_stream();
    inputs_ = static_cast<std::uint8_t*>(cache_->reserved("inputs"));
  }
  ~CacheUnderTest() {
    if (stream_ != nullptr) cache_->destroy_stream(stream_);
  }

  OffloadedStaticCache& cache() { return *cache_; }
  void* stream() const { return stream_; }
  std::string name() const {
    return std::string(backend_name(cache_->backend())) +
           " R=" + std::to_string(cache_->stats().plan.resident_layers) +
           " D=" + std::to_string(config_.ring_depth) + (stream_ ? " async" : " sync");
  }

  // Compares the rows of `slot` a step at `rows` reads with the reference: positions [0, rows)
  // of a full layer, the window's [rows - (window - 1), rows) of a window layer.
  void check(const LayerView& view, Reference& ref, int slot, int rows) {
    check_range(view, ref, slot, view.first_positions != nullptr ? window_start(view, rows) : 0,
                rows);
  }
  // A window layer after an append of positions [first, end): the first one's window and the
  // rows appended.
  void check_window(const LayerView& view, Reference& ref, int slot, int first, int end) {
    check_range(view, ref, slot, window_start(view, first), end);
  }
  static int window_start(const LayerView& view, int position) {
    return std::max(0, position - (view.window - 1));
  }
  // Positions [from, to) of `slot`: row r of a window layer holds position first_positions + r.
  // Under split attention, rows before the slot's split row are read from the host store.
  void check_range(const LayerView& view, Reference& ref, int slot, int from, int to) {
    if (to <= from) return;
    const int split = view.split_rows != nullptr ? view.split_rows[slot] : 0;
    if (split > from) {
      const int end = std::min(split, to);
      for (int kv = 0; kv < 2; ++kv) {
        const auto* base = static_cast<const std::uint8_t*>(kv == 0 ? view.host_k : view.host_v);
        const std::int64_t stride = kv == 0 ? view.slot_stride : view.v_slot_stride;
        const std::int64_t token = kv == 0 ? view.token_stride : view.v_token_stride;
        const std::uint8_t* host =
            base + (slot * stride + static_cast<std::int64_t>(from) * token) *
                       static_cast<std::int64_t>(view.element_size());
        if (std::memcmp(host, ref.row(view.layer, kv, slot, from),
                        static_cast<std::size_t>(end - from) * ref.row_bytes()) != 0) {
          failures_.fetch_add(1);
        }
        ++checks_;
      }
      from = end;
      if (to <= from) return;
    }
    const int first = view.first_positions != nullptr ? view.first_positions[slot] : 0;
    if (first > from) {  // a row the step needs is gone
      failures_.fetch_add(1);
      return;
    }
    const std::size_t bytes = static_cast<std::size_t>(to - from) * ref.row_bytes();
    for (int kv = 0; kv < 2; ++kv) {
      const auto* actual = static_cast<const std::uint8_t*>(
          kv == 0 ? view.k_row(slot, from - first) : view.v_row(slot, from - first));
      const std::uint8_t* expected = ref.row(view.layer, kv, slot, from);
      if (cuda_) {
        cache_->synchronize_stream(stream_);
        std::vector<std::uint8_t> host(bytes);
        cache_->copy_to_host(host.data(), actual, bytes);
        if (std::memcmp(host.data(), expected, bytes) != 0) failures_.fetch_add(1);
      } else {
        tasks_.push_back({actual, expected, bytes, &failures_});
        cache_->launch_host_func(stream_, &CheckTask::run, &tasks_.back());
      }
      ++checks_;
    }
  }

  // Appends rows from host memory (copied to the device region first on CUDA).
  void append(int layer, int slot, const std::uint8_t* k, const std::uint8_t* v, int count,
              std::size_t row_bytes) {
    const std::size_t bytes = static_cast<std::size_t>(count) * row_bytes;
    if (cuda_) {
      cache_->synchronize_stream(stream_);  // the previous append has consumed the region
      cache_->copy_to_device(inputs_, k, bytes);
      cache_->copy_to_device(inputs_ + bytes, v, bytes);
      cache_->append(layer, slot, inputs_, inputs_ + bytes, count, stream_);
    } else {
      cache_->append(layer, slot, k, v, count, stream_);
    }
  }

  void finish_step() {
    cache_->synchronize_stream(stream_);
    tasks_.clear();
  }

  int failures() const { return failures_.load(); }
  long checks() const { return checks_; }

 private:
  CacheConfig config_;
  std::unique_ptr<OffloadedStaticCache> cache_;
  bool cuda_ = false;
  void* stream_ = nullptr;
  std::uint8_t* inputs_ = nullptr;
  std::deque<CheckTask> tasks_;  // stable addresses until the stream has run them
  std::atomic<int> failures_{0};
  long checks_ = 0;
};

struct DriverOptions {
  int steps = 60;
  int max_prefill = 40;
  double reset_probability = 0.08;
  double truncate_probability = 0.08;
  double reorder_probability = 0;  // between steps: reorder_slots with a random source
  // Caches with window layers: truncations go to 0 (a window holds a length's last rows alone)
  // and an append gives at most this many rows (CacheConfig::max_append); 0: no bound.
  bool windows = false;
  int max_append = 0;
  // The first reorders' sources, in order (each one entry per slot), before random ones.
  std::vector<std::vector<int>> reorders;
  // Split attention: the chance that a step gives begin_step a split row for each decoding slot
  // (0, 1, 64, length - 1, length or any row between), and checks the host part in the store.
  double split_probability = 0;
};

// Runs one random sequence on every cache of `caches` (same shape) and returns the number of
// steps run. Every acquire is checked (prefix before appends, prefix + new rows after).
inline int drive(std::vector<std::unique_ptr<CacheUnderTest>>& caches, std::uint64_t seed,
                 const DriverOptions& options) {
  const CacheConfig& config = caches.front()->cache().config();
  const std::size_t row_bytes =
      static_cast<std::size_t>(config.kv_heads) * config.head_dim * dtype_size(config.dtype);
  Reference ref(config.layers, config.slots, config.max_seq, row_bytes);
  std::vector<int> length(static_cast<std::size_t>(config.slots), 0);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  std::size_t forced = 0;  // options.reorders applied so far

  for (int step = 0; step < options.steps; ++step) {
    // Host-side changes between steps.
    for (int s = 0; s < config.slots; ++s) {
      const auto index = static_cast<std::size_t>(s);
      if (chance(options.reset_probability)) {
        length[index] = 0;
        for (auto& c : caches) c->cache().reset_slot(s);
      } else if (length[index] > 0 && chance(options.truncate_probability)) {
        length[index] = options.windows ? 0 : uniform(0, length[index] - 1);
        for (auto& c : caches) c->cache().truncate_slot(s, length[index]);
      }
    }
    if (options.reorder_probability > 0 && chance(options.reorder_probability)) {
      std::vector<int> source(static_cast<std::size_t>(config.slots));
      for (int& from : source) from = uniform(0, config.slots - 1);
      if (forced < options.reorders.size()) source = options.reorders[forced++];
      std::vector<int> moved(length.size());
      for (std::size_t s = 0; s < length.size(); ++s) {
        moved[s] = length[static_cast<std::size_t>(source[s])];
      }
      length = moved;
      ref.reorder(source);
      for (auto& c : caches) {
        c->cache().reorder_slots(source);
        for (int s = 0; s < config.slots; ++s) {
          EXPECT_EQ(c->cache().length(s), length[static_cast<std::size_t>(s)]);
        }
      }
    }
    // New tokens: a prefill now and then, mostly decodes, some idle slots.
    std::vector<std::int32_t> n(static_cast<std::size_t>(config.slots));
    for (int s = 0; s < config.slots; ++s) {
      const auto index = static_cast<std::size_t>(s);
      const int room = config.max_seq - length[index];
      int want = chance(0.2) ? uniform(2, options.max_prefill) : (chance(0.15) ? 0 : 1);
      n[index] = std::min(want, room);
    }
    // Fresh random rows for every layer, slot and tensor of this step.
    std::vector<std::vector<std::uint8_t>> rows(static_cast<std::size_t>(config.layers) * 2 *
                                                config.slots);
    if (chance(options.split_probability)) {
      std::vector<std::int32_t> split(static_cast<std::size_t>(config.slots), 0);
      for (int s = 0; s < config.slots; ++s) {
        const auto index = static_cast<std::size_t>(s);
        const int len = length[index];
        if (n[index] != 1 || len == 0) continue;
        const int pick = uniform(0, 5);
        const int row = pick == 0   ? 0
                        : pick == 1 ? 1
                        : pick == 2 ? 64
                        : pick == 3 ? len - 1
                        : pick == 4 ? len
                                    : uniform(0, len);
        split[index] = std::min(row, len);
      }
      for (auto& c : caches) c->cache().begin_step(n, split);
    } else {
      for (auto& c : caches) c->cache().begin_step(n);
    }
    for (int layer = 0; layer < config.layers; ++layer) {
      for (int s = 0; s < config.slots; ++s) {
        for (int kv = 0; kv < 2; ++kv) {
          auto& r = rows[(static_cast<std::size_t>(layer) * 2 + kv) * config.slots + s];
          r.resize(static_cast<std::size_t>(n[static_cast<std::size_t>(s)]) * row_bytes);
          for (auto& byte : r) byte = static_cast<std::uint8_t>(rng());
          if (!r.empty()) {
            std::memcpy(ref.row(layer, kv, s, length[static_cast<std::size_t>(s)]), r.data(),
                        r.size());
          }
        }
      }
      // Chunk boundaries for this layer's appends (the same for every cache).
      std::vector<std::vector<int>> chunks(static_cast<std::size_t>(config.slots));
      for (int s = 0; s < config.slots; ++s) {
        int left = n[static_cast<std::size_t>(s)];
        while (left > 0) {
          int piece = chance(0.5) ? left : uniform(1, left);
          if (options.max_append > 0) piece = std::min(piece, options.max_append);
          chunks[static_cast<std::size_t>(s)].push_back(piece);
          left -= piece;
        }
      }
      for (auto& c : caches) {
        const LayerView view = c->cache().acquire(layer, c->stream());
        EXPECT_EQ(view.layer, layer);
        for (int s = 0; s < config.slots; ++s) {
          const auto index = static_cast<std::size_t>(s);
          EXPECT_EQ(view.lengths[s], length[index]);
          EXPECT_EQ(view.new_tokens[s], n[index]);
          c->check(view, ref, s, length[index]);
          const auto& k = rows[(static_cast<std::size_t>(layer) * 2 + 0) * config.slots + s];
          const auto& v = rows[(static_cast<std::size_t>(layer) * 2 + 1) * config.slots + s];
          int done = 0;
          for (int piece : chunks[index]) {
            c->append(layer, s, k.data() + done * row_bytes, v.data() + done * row_bytes, piece,
                      row_bytes);
            done += piece;
            if (view.first_positions != nullptr) {  // what this piece's attention reads
              c->check_window(view, ref, s, length[index] + done - piece, length[index] + done);
            }
          }
          if (view.first_positions == nullptr) {
            c->check(view, ref, s, length[index] + n[index]);  // what attention reads
          }
        }
        c->cache().release(layer, c->stream());
      }
    }
    for (auto& c : caches) {
      c->cache().end_step();
      c->finish_step();
    }
    for (int s = 0; s < config.slots; ++s) {
      length[static_cast<std::size_t>(s)] += n[static_cast<std::size_t>(s)];
      for (auto& c : caches) EXPECT_EQ(c->cache().length(s), length[static_cast<std::size_t>(s)]);
    }
  }
  return options.steps;
}

}  // namespace kvo::testing
