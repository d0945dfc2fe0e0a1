// Saved contexts: a slot saved and loaded holds exactly the rows it had, whatever layers are
// resident on either side; every refusal (another shape, dtype, max_seq or model; a truncated or
// corrupted file, a byte flipped in each region of it) names what is wrong and leaves the cache
// as it was.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kvoffload/fingerprint.hpp"
#include "kvoffload/kvoffload.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/stream_copy.hpp"

namespace kvo {
namespace {

using testing::expect_error;

CacheConfig small_config(int resident) {
  CacheConfig config;
  config.layers = 5;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.max_seq = 48;
  config.slots = 2;
  config.dtype = DType::kF16;
  config.resident_layers = resident;
  config.ring_depth = 2;
  config.backend = BackendKind::kHost;
  config.host.max_delay_us = 50;
  config.host.delay_seed = 7;
  return config;
}

std::size_t row_bytes(const CacheConfig& c) {
  return static_cast<std::size_t>(kv_row_bytes(c.dtype, c.kv_heads, c.head_dim));
}
std::size_t v_row_bytes(const CacheConfig& c) {
  return static_cast<std::size_t>(
      kv_row_bytes(c.dtype, c.kv_heads, c.v_head_dim > 0 ? c.v_head_dim : c.head_dim));
}

// Appends `count` random rows to `slot` (every layer, K and V) in one step.
void fill(OffloadedStaticCache& cache, int slot, int count, std::uint64_t seed) {
  const CacheConfig& c = cache.config();
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> n(static_cast<std::size_t>(c.slots), 0);
  n[static_cast<std::size_t>(slot)] = count;
  std::vector<std::uint8_t> k(static_cast<std::size_t>(count) * row_bytes(c));
  std::vector<std::uint8_t> v(static_cast<std::size_t>(count) * v_row_bytes(c));
  cache.begin_step(n);
  for (int layer = 0; layer < c.layers; ++layer) {
    for (auto& byte : k) byte = static_cast<std::uint8_t>(rng());
    for (auto& byte : v) byte = static_cast<std::uint8_t>(rng());
    cache.acquire(layer);
    cache.append(layer, slot, k.data(), v.data(), count);
    cache.release(layer);
  }
  cache.end_step();
}

// What a caller can see of the cache: each slot's length and its rows [0, length) of every
// layer, read through a step that appends nothing (so through the prefetches, as a model would).
struct Snapshot {
  std::vector<int> lengths;
  std::vector<std::vector<std::uint8_t>> rows;  // [slot][layer][K|V][token][row]
  bool operator==(const Snapshot& o) const { return lengths == o.lengths && rows == o.rows; }
};

Snapshot snapshot(OffloadedStaticCache& cache) {
  const CacheConfig& c = cache.config();
  Snapshot snap;
  snap.rows.resize(static_cast<std::size_t>(c.slots));
  for (int s = 0; s < c.slots; ++s) snap.lengths.push_back(cache.length(s));
  cache.begin_step(std::vector<std::int32_t>(static_cast<std::size_t>(c.slots), 0));
  for (int layer = 0; layer < c.layers; ++layer) {
    const LayerView view = cache.acquire(layer);
    for (int s = 0; s < c.slots; ++s) {
      for (int kv = 0; kv < 2; ++kv) {
        const std::size_t bytes =
            static_cast<std::size_t>(view.lengths[s]) * (kv == 0 ? row_bytes(c) : v_row_bytes(c));
        const auto* p =
            static_cast<const std::uint8_t*>(kv == 0 ? view.k_row(s, 0) : view.v_row(s, 0));
        snap.rows[static_cast<std::size_t>(s)].insert(snap.rows[static_cast<std::size_t>(s)].end(),
                                                      p, p + bytes);
      }
    }
    cache.release(layer);
  }
  cache.end_step();
  return snap;
}

class CacheContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvo_context_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

TEST_F(CacheContextTest, RoundTripAcrossResidentSplits) {
  for (int saved_resident : {0, 2, 5}) {
    for (int loaded_resident : {0, 3, 5}) {
      SCOPED_TRACE("resident " + std::to_string(saved_resident) + " -> " +
                   std::to_string(loaded_resident));
      OffloadedStaticCache source(small_config(saved_resident));
      fill(source, 0, 17, 1);
      fill(source, 1, 9, 2);
      fill(source, 0, 3, 3);  // a second step: rows written back at a non-zero length
      const std::vector<std::int32_t> ids = {5,  4,  3,  2,  1,  0,  7,  8,  9,  10,
                                             11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
      source.save_slot(0, path("ctx"), {ids, "architecture=test\nlayers=5"});
      const Snapshot before = snapshot(source);

      OffloadedStaticCache target(small_config(loaded_resident));
      fill(target, 1, 9, 2);   // slot 1 as in the source
      (void)snapshot(target);  // prefetches for the next step are issued at the old lengths
      const SlotContext loaded = target.load_slot(0, path("ctx"), "architecture=test\nlayers=5");
      EXPECT_EQ(loaded.tokens, ids);
      EXPECT_EQ(loaded.model, "architecture=test\nlayers=5");
      EXPECT_EQ(snapshot(target), before);
      if (target.stats().plan.streamed_layers > 0) {
        EXPECT_GT(target.stats().prefetch_reissues, 0u);  // issued again at the loaded length
      }

      // Both continue alike: the loaded rows are the prefix of the next step's attention.
      fill(source, 0, 4, 9);
      fill(target, 0, 4, 9);
      EXPECT_EQ(snapshot(target), snapshot(source));
    }
  }
}

// Multi-head latent attention's rows (K and V of different head sizes) round-trip too, in a
// record of format version 2 that names V's head size; a cache whose V head size differs refuses
// it by name. Rows of one size keep writing version 1, byte for byte as before.
TEST_F(CacheContextTest, VRowsOfTheirOwnSizeRoundTrip) {
  auto latent = [](int resident, int v_head_dim) {
    CacheConfig c = small_config(resident);
    c.head_dim = 16;  // the latent
    c.v_head_dim = v_head_dim;
    return c;
  };
  for (int saved_resident : {0, 5}) {
    for (int loaded_resident : {0, 2, 5}) {
      SCOPED_TRACE("resident " + std::to_string(saved_resident) + " -> " +
                   std::to_string(loaded_resident));
      OffloadedStaticCache source(latent(saved_resident, 6));
      fill(source, 0, 13, 21);
      fill(source, 1, 5, 22);
      source.save_slots({0, 1}, path("latent"), {{{}, "mla"}, {{}, "mla"}});
      const std::vector<std::uint8_t> file = read_bytes(path("latent"));
      // Each record: the fixed header (52 bytes), v_head_dim (4), the model text, the header's
      // checksum (8); then per layer its K rows, its V rows and a checksum.
      const CacheConfig c = latent(0, 6);
      auto record = [&](std::size_t rows) {
        return 52 + 4 + 3 + 8 + 5 * (rows * (row_bytes(c) + v_row_bytes(c)) + 8);
      };
      ASSERT_EQ(file.size(), record(13) + record(5));
      EXPECT_EQ(file[8], 2);  // version 2: V rows have a head size of their own
      const SavedContextInfo info = inspect_saved_context(path("latent"));
      EXPECT_EQ(info.head_dim, 16);
      EXPECT_EQ(info.v_head_dim, 6);

      OffloadedStaticCache target(latent(loaded_resident, 6));
      fill(target, 0, 2, 23);  // rows to replace
      target.load_slots({0, 1}, path("latent"), "mla");
      EXPECT_EQ(snapshot(target), snapshot(source));
      fill(source, 0, 3, 24);
      fill(target, 0, 3, 24);
      EXPECT_EQ(snapshot(target), snapshot(source));
    }
  }
  OffloadedStaticCache other(latent(2, 8));
  const Snapshot before = snapshot(other);
  expect_error(
      [&] {
        other.load_slots({0, 1}, path("latent"), "mla");
      },
      ErrorCode::kInvalidArgument, "v_head_dim 6, this one has v_head_dim 8");
  EXPECT_EQ(snapshot(other), before);
  OffloadedStaticCache same_size(small_config(2));
  fill(same_size, 0, 4, 25);
  same_size.save_slot(0, path("plain"), {{}, "plain"});
  EXPECT_EQ(read_bytes(path("plain"))[8], 1);
}

// Files are restored from a mapping with streaming stores that start at an aligned address and
// end with a copy of the rest: rows of widths that are no multiple of 16 or 32 bytes, in place or
// through a buffer at any offset, in blocks whose sizes leave every remainder, come back exactly.
TEST_F(CacheContextTest, RowsOfAnyWidthAndAlignmentRoundTrip) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kInt8, DType::kFP8E4M3}) {
    for (int trial = 0; trial < 6; ++trial) {
      CacheConfig c = small_config(static_cast<int>(rng() % 3));
      c.kv_heads = 1 + static_cast<int>(rng() % 3);
      c.head_dim = 1 + static_cast<int>(rng() % 13);
      c.max_seq = 5 + static_cast<int>(rng() % 40);
      c.dtype = dtype;
      const int slot = static_cast<int>(rng() % 2);
      const int length = 1 + static_cast<int>(rng() % c.max_seq);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " kv_heads " + std::to_string(c.kv_heads) +
                   " head_dim " + std::to_string(c.head_dim) + " max_seq " +
                   std::to_string(c.max_seq) + " slot " + std::to_string(slot) + " length " +
                   std::to_string(length));
      OffloadedStaticCache source(c);
      fill(source, slot, length, rng());
      source.save_slot(slot, path("ctx"));
      OffloadedStaticCache target(c);
      // Into an empty slot the rows go in place; into one that holds rows, through a buffer.
      if (trial % 2 == 1) fill(target, slot, 1 + static_cast<int>(rng() % c.max_seq), rng());
      target.load_slot(slot, path("ctx"));
      EXPECT_EQ(snapshot(target), snapshot(source));
    }
  }
}

// FileSource::map_ahead: the bytes past the current position, or nothing when they are not all
// in the file; the position does not move.
TEST_F(CacheContextTest, AFileMapsTheBytesAheadOrNothing) {
  std::mt19937_64 rng(3);
  std::vector<std::uint8_t> bytes(300000);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  write_bytes(path("data"), bytes);
  offload::FileSource source(path("data"));
  ASSERT_TRUE(source.skip(1000));
  const std::byte* p = source.map_ahead(24, 5000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, bytes.data() + 1024, 5000), 0);
  const std::byte* all = source.map_ahead(0, bytes.size() - 1000);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(std::memcmp(all, bytes.data() + 1000, bytes.size() - 1000), 0);
  EXPECT_EQ(source.map_ahead(0, bytes.size() - 999), nullptr);
  EXPECT_EQ(source.map_ahead(bytes.size() - 1000, 1), nullptr);
  EXPECT_EQ(source.map_ahead(bytes.size(), 1), nullptr);
  EXPECT_EQ(source.map_ahead(0, 0), nullptr);
  std::uint8_t next[4];
  ASSERT_EQ(source.read(next, sizeof(next)), sizeof(next));
  EXPECT_EQ(std::memcmp(next, bytes.data() + 1000, sizeof(next)), 0);
}

// ContextReading::kPread turns mapping off: files are read with pread, and still restore exactly.
TEST_F(CacheContextTest, MappingCanBeTurnedOff) {
  OffloadedStaticCache source(small_config(0));
  fill(source, 0, 21, 4);
  source.save_slot(0, path("ctx"));
  EXPECT_EQ(offload::FileSource(path("ctx"), false).map_ahead(0, 1), nullptr);
  EXPECT_NE(offload::FileSource(path("ctx")).map_ahead(0, 1), nullptr);
  CacheConfig read = small_config(0);
  read.context_reading = ContextReading::kPread;
  OffloadedStaticCache target(read);
  target.load_slot(0, path("ctx"));
  EXPECT_EQ(snapshot(target), snapshot(source));
  OffloadedStaticCache from_file(small_config(0));
  SavedContextFile file(path("ctx"), ContextReading::kPread);
  from_file.load_slots({0}, file);
  EXPECT_EQ(snapshot(from_file), snapshot(source));
}

// Both streaming copies (where the CPU runs them) against memcpy, for every destination and
// source alignment within 32 bytes and sizes around the 16-, 32-, 64- and 128-byte steps.
TEST(StreamingCopy, CopiesEveryAlignmentAndSizeExactly) {
  std::vector<offload::CopyFn> copies = {offload::copy_streaming_sse2};
#if defined(KVO_HASH_AVX2)
  if (__builtin_cpu_supports("avx2")) copies.push_back(offload::copy_streaming_avx2);
#endif
  std::mt19937 rng(8);
  std::vector<std::byte> src(700), dst(700), want(700);
  for (auto& b : src) b = static_cast<std::byte>(rng());
  for (offload::CopyFn copy : copies) {
    for (std::size_t d = 0; d < 32; ++d) {
      for (std::size_t s : {0, 1, 7, 16, 31}) {
        for (std::size_t n = 0; n <= 300; n += (n < 140 ? 1 : 37)) {
          for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = want[i] = std::byte{0x5a};
          std::memcpy(want.data() + d, src.data() + s, n);
          copy(dst.data() + d, src.data() + s, n);
          offload::fence_streaming_stores();
          ASSERT_EQ(dst, want) << "dst offset " << d << ", src offset " << s << ", " << n
                               << " bytes";
        }
      }
    }
  }
}

TEST_F(CacheContextTest, LoadIntoASlotThatHoldsRowsReplacesThem) {
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 11, 1);
  source.save_slot(0, path("ctx"));
  OffloadedStaticCache target(small_config(1));
  fill(target, 0, 30, 5);
  fill(target, 1, 6, 6);
  target.load_slot(0, path("ctx"));
  const Snapshot loaded = snapshot(target);
  EXPECT_EQ(loaded.lengths, (std::vector<int>{11, 6}));
  const Snapshot expected = snapshot(source);
  EXPECT_EQ(loaded.rows[0], expected.rows[0]);
}

TEST_F(CacheContextTest, SeveralSlotsInOneFileAndStreams) {
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 13, 1);
  fill(source, 1, 21, 2);
  source.save_slots({1, 0}, path("two"), {{}, {}});
  const SavedContextInfo info = inspect_saved_context(path("two"));
  EXPECT_EQ(info.lengths, (std::vector<int>{21, 13}));
  EXPECT_EQ(info.layers, 5);
  EXPECT_EQ(info.max_seq, 48);
  EXPECT_EQ(info.dtype, DType::kF16);

  OffloadedStaticCache swapped(small_config(0));
  swapped.load_slots({0, 1}, path("two"));  // slot 1's context into slot 0 and back
  const Snapshot a = snapshot(source);
  const Snapshot b = snapshot(swapped);
  EXPECT_EQ(b.lengths, (std::vector<int>{21, 13}));
  EXPECT_EQ(b.rows[0], a.rows[1]);
  EXPECT_EQ(b.rows[1], a.rows[0]);

  // A file of two contexts is not one context.
  OffloadedStaticCache one(small_config(0));
  expect_error([&] { one.load_slot(0, path("two")); }, ErrorCode::kInvalidArgument,
               "more bytes follow its 1 saved context(s)");
  EXPECT_EQ(one.length(0), 0);

  std::stringstream stream;
  source.save_slot(1, stream, {});
  source.save_slot(0, stream, {});
  OffloadedStaticCache streamed(small_config(3));
  streamed.load_slot(0, stream);
  streamed.load_slot(1, stream);
  EXPECT_EQ(snapshot(streamed), b);
}

TEST_F(CacheContextTest, RefusesAnotherShapeDtypeMaxSeqOrModel) {
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 10, 1);
  source.save_slot(0, path("ctx"), {{}, "architecture=LlamaForCausalLM\nhidden_size=64\nx=1"});

  struct Case {
    const char* what;
    void (*change)(CacheConfig&);
    const char* needle;
  };
  const Case cases[] = {
      {"layers", [](CacheConfig& c) { c.layers = 6; }, "layers 5, this one has layers 6"},
      {"kv_heads", [](CacheConfig& c) { c.kv_heads = 1; }, "kv_heads 2, this one has kv_heads 1"},
      {"head_dim", [](CacheConfig& c) { c.head_dim = 16; }, "head_dim 8, this one has head_dim 16"},
      {"dtype", [](CacheConfig& c) { c.dtype = DType::kBF16; }, "K/V dtype f16, this one has"},
      {"max_seq", [](CacheConfig& c) { c.max_seq = 64; }, "max_seq 48, this one has max_seq 64"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    CacheConfig config = small_config(1);
    k.change(config);
    OffloadedStaticCache target(config);
    fill(target, 0, 3, 4);
    const Snapshot before = snapshot(target);
    expect_error(
        [&] {
          target.load_slot(0, path("ctx"), "architecture=LlamaForCausalLM\nhidden_size=64\nx=1");
        },
        ErrorCode::kInvalidArgument, k.needle);
    EXPECT_EQ(snapshot(target), before);
  }

  OffloadedStaticCache target(small_config(1));
  fill(target, 0, 3, 4);
  const Snapshot before = snapshot(target);
  expect_error(
      [&] {
        target.load_slot(0, path("ctx"), "architecture=LlamaForCausalLM\nhidden_size=96\nx=1");
      },
      ErrorCode::kInvalidArgument,
      "its fingerprint has 'hidden_size=64' where this model's has 'hidden_size=96'");
  expect_error([&] { target.load_slot(0, path("ctx"), ""); }, ErrorCode::kInvalidArgument,
               "'architecture=LlamaForCausalLM' where this model's has nothing more");
  EXPECT_EQ(snapshot(target), before);
}

// The regions of a saved context of `length` rows, as [begin, end) byte ranges with a name and
// what the refusal must say.
struct Region {
  std::string name;
  std::size_t begin;
  std::size_t end;
  std::string needle;
};

std::vector<Region> regions(std::size_t model_bytes, std::size_t tokens, int layers,
                            std::size_t block_rows_bytes) {
  std::vector<Region> out;
  std::size_t at = 0;
  auto add = [&](const std::string& name, std::size_t bytes, const std::string& needle) {
    out.push_back({name, at, at + bytes, needle});
    at += bytes;
  };
  add("magic", 8, "not a saved context");
  add("version", 4, "format version");
  add("shape fields", 24, "the header is corrupted");
  add("row_bytes", 8, "the header is corrupted");
  add("model_bytes", 4, "");  // a wrong size: refused as corrupted or truncated
  add("token_count", 4, "the header is corrupted");
  add("model text", model_bytes, "the header is corrupted");
  add("token ids", 4 * tokens, "the header is corrupted");
  add("header checksum", 8, "the header is corrupted");
  for (int layer = 0; layer < layers; ++layer) {
    const std::string block = "the block of layer " + std::to_string(layer) + " of " +
                              std::to_string(layers) + " is corrupted";
    add("layer " + std::to_string(layer) + " K", block_rows_bytes, block);
    add("layer " + std::to_string(layer) + " V", block_rows_bytes, block);
    add("layer " + std::to_string(layer) + " checksum", 8, block);
  }
  return out;
}

// A tensor-parallel rank's file holds its own KV heads: a cache holding other heads of the same
// model (another rank), all of them (another world size) or none of a shard refuses it by name
// before any row moves, though its shape may match to the byte; the same range restores it.
// Fingerprints of the library's format (kvoffload/fingerprint.hpp) are compared field by field;
// a context saved with an older fingerprint cannot be checked against one, and says so.
TEST_F(CacheContextTest, FingerprintsAreComparedFieldByFieldAndOlderOnesRefused) {
  Fingerprint model;
  model.set_number("config.rope_parameters.rope_theta", 500000);
  model.set("weights.xxh3", "0123456789abcdef0123456789abcdef");
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 10, 1);
  source.save_slot(0, path("ctx"), {{}, model.text()});
  source.save_slot(1, path("older"), {{}, "architecture=LlamaForCausalLM\nhidden_size=64"});

  OffloadedStaticCache target(small_config(1));
  fill(target, 0, 3, 4);
  const Snapshot before = snapshot(target);
  Fingerprint other = model;
  other.set_number("config.rope_parameters.rope_theta", 10000);
  expect_error([&] { target.load_slot(0, path("ctx"), other.text()); }, ErrorCode::kInvalidArgument,
               "saved for another model: config.rope_parameters.rope_theta is 500000 in the file "
               "and 10000 here; nothing was loaded");
  expect_error([&] { target.load_slot(0, path("older"), model.text()); },
               ErrorCode::kInvalidArgument, "predates the full model fingerprint");
  EXPECT_EQ(snapshot(target), before);
  target.load_slot(0, path("ctx"), model.text());
  EXPECT_EQ(target.length(0), 10);
}

TEST_F(CacheContextTest, ARankRestoresOnlyItsOwnHeads) {
  auto rank = [](int begin, int model_heads) {
    CacheConfig c = small_config(2);
    c.shard.kv_head_begin = begin;
    c.shard.model_kv_heads = model_heads;
    return c;
  };
  const std::string model = "architecture=LlamaForCausalLM\nhidden_size=64";
  OffloadedStaticCache source(rank(2, 4));  // heads [2, 4) of 4: rank 1 of 2
  fill(source, 0, 10, 11);
  fill(source, 1, 7, 12);
  source.save_slots({0, 1}, path("rank1"), {{{}, model}, {{}, model}});
  EXPECT_EQ(inspect_saved_context(path("rank1")).contexts[0].model,
            "kv_heads_held=[2, 4) of 4\n" + model);

  struct Case {
    CacheConfig config;
    const char* needle;
  };
  const Case cases[] = {
      {rank(0, 4),
       "saved by a cache holding KV heads [2, 4) of 4, this one holds KV heads [0, 2) of 4"},
      {rank(2, 6),
       "saved by a cache holding KV heads [2, 4) of 4, this one holds KV heads [2, 4) "
       "of 6"},
      {rank(0, 0),
       "saved by a cache holding KV heads [2, 4) of 4, this one holds all of its KV "
       "heads"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.needle);
    OffloadedStaticCache target(k.config);
    fill(target, 0, 3, 4);
    const Snapshot before = snapshot(target);
    expect_error(
        [&] {
          target.load_slots({0, 1}, path("rank1"), model);
        },
        ErrorCode::kInvalidArgument, k.needle);
    EXPECT_EQ(snapshot(target), before);
  }
  // A whole-model file on a shard: refused the other way round.
  OffloadedStaticCache whole(rank(0, 0));
  fill(whole, 0, 5, 13);
  whole.save_slot(0, path("whole"), {{}, model});
  OffloadedStaticCache shard(rank(0, 4));
  expect_error([&] { shard.load_slot(0, path("whole"), model); }, ErrorCode::kInvalidArgument,
               "saved by a cache holding all of its KV heads, this one holds KV heads [0, 2) of 4");
  // A cache whose range is the whole model is no shard: its files are any whole cache's.
  OffloadedStaticCache full_range(rank(0, 2));
  full_range.load_slot(0, path("whole"), model);
  EXPECT_EQ(full_range.length(0), 5);

  OffloadedStaticCache same(rank(2, 4));
  same.load_slots({0, 1}, path("rank1"), model);
  EXPECT_EQ(snapshot(same), snapshot(source));
}

TEST_F(CacheContextTest, AFlippedByteInEachRegionIsRefusedAndChangesNothing) {
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 12, 1);
  const std::string model = "architecture=test\nlayers=5";
  std::vector<std::int32_t> ids(12);
  for (int i = 0; i < 12; ++i) ids[static_cast<std::size_t>(i)] = 100 + i;
  source.save_slot(0, path("ctx"), {ids, model});
  const std::vector<std::uint8_t> good = read_bytes(path("ctx"));
  const std::size_t block_rows = 12 * row_bytes(source.config());
  const std::vector<Region> all = regions(model.size(), ids.size(), 5, block_rows);
  ASSERT_EQ(all.back().end, good.size());

  std::mt19937_64 rng(11);
  for (const Region& region : all) {
    // Flip a random bit of a random byte of the region, and also its first and last byte.
    for (std::size_t at :
         {region.begin, region.end - 1, region.begin + rng() % (region.end - region.begin)}) {
      SCOPED_TRACE(region.name + " byte " + std::to_string(at));
      std::vector<std::uint8_t> bad = good;
      bad[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      write_bytes(path("bad"), bad);
      for (bool empty_target : {true, false}) {
        OffloadedStaticCache target(small_config(empty_target ? 3 : 1));
        if (!empty_target) fill(target, 0, 20, 5);
        fill(target, 1, 4, 6);
        const Snapshot before = snapshot(target);
        try {
          target.load_slot(0, path("bad"), model);
          ADD_FAILURE() << "a corrupted file was loaded";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
          if (!region.needle.empty()) {
            EXPECT_NE(std::string(e.what()).find(region.needle), std::string::npos) << e.what();
          }
        }
        EXPECT_EQ(snapshot(target), before);
      }
    }
  }
}

TEST_F(CacheContextTest, ATruncatedFileIsRefusedNamingTheBlock) {
  OffloadedStaticCache source(small_config(2));
  fill(source, 0, 12, 1);
  source.save_slot(0, path("ctx"), {{}, "m=1"});
  const std::vector<std::uint8_t> good = read_bytes(path("ctx"));
  const std::vector<Region> all = regions(3, 0, 5, 12 * row_bytes(source.config()));
  for (const Region& region : all) {
    const std::size_t cut = region.begin + (region.end - region.begin) / 2;
    SCOPED_TRACE(region.name + ": cut at " + std::to_string(cut));
    write_bytes(path("short"), std::vector<std::uint8_t>(good.begin(), good.begin() + cut));
    OffloadedStaticCache target(small_config(1));
    fill(target, 0, 7, 5);
    const Snapshot before = snapshot(target);
    std::string needle = "truncated";
    if (region.name.rfind("layer ", 0) == 0) {
      needle = "truncated in the block of layer " + region.name.substr(6, 1) + " of 5";
    } else if (region.name == "magic") {
      needle = "not a saved context";
    }
    expect_error([&] { target.load_slot(0, path("short"), "m=1"); }, ErrorCode::kInvalidArgument,
                 needle);
    EXPECT_EQ(snapshot(target), before);
  }
  write_bytes(path("empty"), {});
  OffloadedStaticCache target(small_config(1));
  expect_error([&] { target.load_slot(0, path("empty")); }, ErrorCode::kInvalidArgument,
               "empty: no saved context in it");
  expect_error([&] { target.load_slot(0, path("missing")); }, ErrorCode::kInvalidArgument,
               path("missing") + ": cannot open it: No such file or directory");
}

TEST_F(CacheContextTest, SaveIsAtomicAndChecksItsArguments) {
  OffloadedStaticCache cache(small_config(2));
  fill(cache, 0, 5, 1);
  cache.save_slot(0, path("ctx"), {{1, 2, 3, 4, 5}, "m=1"});
  const std::vector<std::uint8_t> first = read_bytes(path("ctx"));

  expect_error(
      [&] {
        cache.save_slot(0, path("ctx"), {{1, 2}, "m=2"});
      },
      ErrorCode::kInvalidArgument, "holds 5 rows but 2 token ids were given");
  expect_error([&] { cache.save_slot(2, path("ctx")); }, ErrorCode::kInvalidArgument,
               "slot 2 is out of range");
  expect_error(
      [&] {
        cache.save_slots({0, 0}, path("ctx"), {{}, {}});
      },
      ErrorCode::kInvalidArgument, "slot 0 is named twice");
  expect_error([&] { cache.save_slot(0, path("no/such/dir/ctx")); }, ErrorCode::kInvalidArgument,
               "cannot create a temporary file beside " + path("no/such/dir/ctx"));
  EXPECT_EQ(read_bytes(path("ctx")), first);  // refused saves left the old file as it was

  fill(cache, 0, 2, 2);
  cache.save_slot(0, path("ctx"));
  EXPECT_NE(read_bytes(path("ctx")), first);
  // Only the file itself is left in the directory: no temporary file.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);

  cache.begin_step({1, 0});
  expect_error([&] { cache.save_slot(0, path("x")); }, ErrorCode::kProtocol,
               "only allowed between steps");
  expect_error([&] { cache.load_slot(0, path("ctx")); }, ErrorCode::kProtocol,
               "only allowed between steps");
  cache.abort_step();
}

}  // namespace
}  // namespace kvo
