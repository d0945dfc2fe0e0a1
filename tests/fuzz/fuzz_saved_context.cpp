// libFuzzer target: the saved-context reader. A record's header either is refused with kvo::Error
// or gives a shape and a length within it (and token ids: none, or one per row); its rows are
// then read, into host rows of that shape, and either refused with kvo::Error naming the layer
// block or read whole. Then the same bytes go to a cache (host backend) whose slot 1 holds rows:
// a refusal leaves those rows and that length exactly as they were.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "offload/context/context_file.hpp"
#include "offload/util/byte_io.hpp"

namespace {

// Host memory of one slot's rows: K and V of each layer, max_seq rows each.
class HostRows : public kvo::offload::SlotRows {
 public:
  explicit HostRows(const kvo::offload::ContextShape& s)
      : bytes_(static_cast<std::size_t>(s.max_seq) * s.row_bytes),
        rows_(static_cast<std::size_t>(2 * s.layers) * bytes_) {}
  std::byte* host_rows(int layer, int kv) override {
    return rows_.data() + (2 * static_cast<std::size_t>(layer) + kv) * bytes_;
  }
  void copy_from_device(int, int, std::size_t, std::size_t, void*) override { std::abort(); }
  void copy_to_device(int, int, std::size_t, std::size_t, const void*) override { std::abort(); }

 private:
  std::size_t bytes_;
  std::vector<std::byte> rows_;
};

kvo::CacheConfig shape() {
  kvo::CacheConfig c;
  c.layers = 3;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.max_seq = 16;
  c.slots = 2;
  c.dtype = kvo::DType::kF32;
  c.resident_layers = 1;
  c.backend = kvo::BackendKind::kHost;
  return c;
}

// A cache whose slot 1 holds 5 rows of known bytes, and those bytes saved.
struct Filled {
  kvo::OffloadedStaticCache cache{shape()};
  std::string saved;
  Filled() {
    const kvo::CacheConfig s = shape();
    std::vector<float> rows(5 * s.kv_heads * s.head_dim);
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = 0.25f * static_cast<float>(i);
    cache.begin_step({0, 5});
    for (int layer = 0; layer < s.layers; ++layer) {
      cache.acquire(layer);
      cache.append(layer, 1, rows.data(), rows.data(), 5);
      cache.release(layer);
    }
    cache.end_step();
    std::ostringstream out;
    cache.save_slot(1, out, {{}, "model=fuzz"});
    saved = out.str();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The reader alone, on whatever shape the header gives (a small one: rows are allocated).
  {
    std::istringstream in(bytes);
    kvo::offload::StreamSource source(in);
    try {
      const kvo::offload::ContextHeader h = kvo::offload::read_context_header(source, "fuzz");
      const kvo::offload::ContextShape& s = h.shape;
      if (h.length < 0 || h.length > s.max_seq || s.layers <= 0 || s.row_bytes == 0) std::abort();
      if (!h.tokens.empty() && static_cast<int>(h.tokens.size()) != h.length) std::abort();
      if (static_cast<std::uint64_t>(s.layers) * s.max_seq * s.row_bytes <=
          (std::uint64_t{8} << 20)) {
        HostRows rows(s);
        kvo::offload::read_context_rows(source, h, rows, nullptr, "fuzz");
      }
    } catch (const kvo::Error&) {
    }
  }
  // Through a cache: a refusal changes nothing.
  static Filled f;
  std::istringstream in(bytes);
  bool loaded = false;
  try {
    const kvo::SlotContext context = f.cache.load_slot(1, in, "model=fuzz");
    loaded = true;
    if (f.cache.length(1) > shape().max_seq) std::abort();
    if (!context.tokens.empty() && static_cast<int>(context.tokens.size()) != f.cache.length(1)) {
      std::abort();
    }
  } catch (const kvo::Error&) {
  }
  std::ostringstream after;
  f.cache.save_slot(1, after, {{}, "model=fuzz"});
  if (!loaded && after.str() != f.saved) std::abort();  // refused, yet something changed
  if (loaded) {
    std::istringstream restore(f.saved);
    f.cache.load_slot(1, restore, "model=fuzz");
  }
  return 0;
}
