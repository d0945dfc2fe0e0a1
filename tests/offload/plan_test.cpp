// The device plan: exact bytes per purpose, the largest resident-layer count that fits, and a
// refusal that names the missing bytes; byte sizes as users type them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace kvo {
namespace {

CacheConfig llama3_8b(int max_seq) {
  CacheConfig c;  // the defaults are Llama-3-8B's KV shape
  c.max_seq = max_seq;
  return c;
}

TEST(Plan, Llama3ShapeHas128KiBOfKvPerToken) {
  const CachePlan plan = plan_cache(llama3_8b(131072), 0);
  EXPECT_EQ(plan.row_bytes, 8u * 128 * 2);
  // 32 layers x K and V x 2 KiB = 128 KiB per token; 16 GiB at 128K.
  EXPECT_EQ(plan.layer_bytes * 32 / 131072, 128u * 1024);
  EXPECT_EQ(plan.layer_bytes * 32, 16ull << 30);
  EXPECT_EQ(plan.resident_layers, 32);  // no budget: everything resident
  EXPECT_EQ(plan.host_bytes, 0u);
}

TEST(Plan, BytesPerPurposeAddUp) {
  CacheConfig c = llama3_8b(4096);
  c.slots = 3;
  c.resident_layers = 5;
  c.ring_depth = 3;
  c.reserved = {{"weights", 1000}, {"activations", 256}};
  const CachePlan plan = plan_cache(c, 0);
  const std::uint64_t layer = 2ull * 3 * 4096 * 2048;
  EXPECT_EQ(plan.layer_bytes, layer);
  EXPECT_EQ(plan.resident_bytes, 5 * layer);
  EXPECT_EQ(plan.staging_bytes, 3 * layer);
  EXPECT_EQ(plan.reserved_bytes, 1024u + 256u);  // each region rounded up to 256 bytes
  EXPECT_EQ(plan.device_bytes, 8 * layer + 1280);
  EXPECT_EQ(plan.host_bytes, 27 * layer);
  EXPECT_EQ(plan.streamed_layers, 27);
  EXPECT_EQ(plan_device_bytes(c, 5), plan.device_bytes);
}

TEST(Plan, AutoKeepsTheLargestResidentCountThatFits) {
  CacheConfig c = llama3_8b(2048);
  c.layers = 12;
  c.ring_depth = 2;
  c.reserved = {{"weights", 12345}};
  const std::uint64_t layer = plan_cache(c, 0).layer_bytes;
  for (std::uint64_t budget = plan_device_bytes(c, 0); budget <= plan_device_bytes(c, 12) + layer;
       budget += layer / 3) {
    const CachePlan plan = plan_cache(c, budget);
    EXPECT_LE(plan.device_bytes, budget);
    if (plan.resident_layers < c.layers) {
      EXPECT_GT(plan_device_bytes(c, plan.resident_layers + 1), budget)
          << "R=" << plan.resident_layers << " is not the largest that fits " << budget;
      EXPECT_EQ(plan.ring_depth, 2);
    } else {
      EXPECT_EQ(plan.ring_depth, 0);
    }
  }
  // Exactly the bytes of "everything resident" keeps everything resident.
  EXPECT_EQ(plan_cache(c, plan_device_bytes(c, 12)).resident_layers, 12);
  // R = L - D needs as much as R = L, so it is promoted.
  EXPECT_EQ(plan_device_bytes(c, 10), plan_device_bytes(c, 12));
}

TEST(Plan, ImpossibleBudgetNamesTheMissingBytes) {
  CacheConfig c = llama3_8b(1024);
  c.reserved = {{"weights", 1 << 20}};
  const std::uint64_t need = plan_device_bytes(c, 0);
  try {
    plan_cache(c, need - 4096);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("missing 4.00 KiB (4096 bytes)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(plan_cache(c, need).resident_layers, 0);
}

TEST(Sizes, ParsesWhatUsersType) {
  EXPECT_EQ(parse_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_size("24G"), 24ull << 30);
  EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("80 GB"), 80000000000ull);
  EXPECT_EQ(parse_size("2TiB"), 2ull << 40);
  for (const char* bad : {"24XB", "-1", "", "GiB", "1.2.3GB", "99999999999TiB"}) {
    EXPECT_THROW(parse_size(bad), Error) << bad;
  }
  // Exact to the byte, up to the last one: no trip through a double.
  EXPECT_EQ(parse_size("9007199254740993"), 9007199254740993ull);
  EXPECT_EQ(parse_size("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size(".5KiB"), 512u);
  EXPECT_EQ(parse_size("2.KiB"), 2048u);
  // Found by fuzzing: "." threw std::invalid_argument (an abort in the tools), and sizes between
  // 2^63 and 2^64 bytes went through llround out of its range.
  for (const auto& [bad, why] : std::vector<std::pair<const char*, const char*>>{
           {".", "no number"},
           {".GiB", "no number"},
           {"18446744073709551616", "too large"},
           {"10000000000000000000000", "too large"},
           {"16777216TiB", "too large"},
           {"1.5", "a number of bytes has no fraction"},
           {"1.5.", "more than one decimal point"},
           {"\x1b[2J", "no number"}}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse_size("10000000000000000000"), 10000000000000000000ull);
  try {
    parse_size("24XB");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'24XB'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("unknown unit"), std::string::npos);
  }
  try {
    parse_size("-1");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("negative"), std::string::npos);
  }
}

TEST(Plan, DefaultCudaBudgetKeepsAHeadroom) {
  const std::uint64_t gib = 1ull << 30;
  // max(1 GiB, 5% of the device): 1 GiB on a 16 GiB card, 7.05 GiB on an H200's 141 GiB.
  EXPECT_EQ(device_headroom(16 * gib), gib);
  EXPECT_EQ(device_headroom(141 * gib), 141 * gib / 20);
  EXPECT_EQ(default_device_budget(20 * gib, 24 * gib), 20 * gib - 24 * gib / 20);
  EXPECT_EQ(default_device_budget(10 * gib, 16 * gib), 9 * gib);
  // Nothing left beyond the headroom: 0, which the CUDA cache turns into a clear refusal.
  EXPECT_EQ(default_device_budget(gib / 2, 16 * gib), 0u);
  EXPECT_EQ(default_device_budget(gib, 16 * gib), 0u);
}

TEST(Sizes, NamesAndParsers) {
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(16ull << 30), "16.00 GiB (17179869184 bytes)");
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(dtype_size(parse_dtype("f32")), 4u);
  EXPECT_THROW(parse_dtype("int4"), Error);
  EXPECT_EQ(parse_backend("host"), BackendKind::kHost);
  EXPECT_THROW(parse_backend("tpu"), Error);
}

}  // namespace
}  // namespace kvo
