// The element types' table (offload/util/element_types.hpp) against what each of its users reads
// on its own: the vocabulary's names and sizes, the C ABI's enum, a saved context's codes, the
// GGUF reader's block sizes and the dequantizer's.
#include "offload/util/element_types.hpp"

#include <gtest/gtest.h>

#include <string>

#include "kvoffload/kvoffload.h"
#include "kvoffload/quant.hpp"
#include "kvoffload/types.hpp"

namespace kvo {
namespace {

TEST(ElementTypes, EveryDTypeReadsItsRowEverywhere) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8};
  const std::size_t bytes[] = {4, 2, 2, 1, 1};
  const char* names[] = {"f32", "f16", "bf16", "fp8", "int8"};
  for (int i = 0; i < 5; ++i) {
    const DType d = all[i];
    EXPECT_EQ(dtype_size(d), bytes[i]) << names[i];
    EXPECT_EQ(std::string(dtype_name(d)), names[i]);
    EXPECT_EQ(parse_dtype(names[i]), d);
    DType back = DType::kF32;
    ASSERT_TRUE(dtype_of_c(traits(d).c_dtype, &back)) << names[i];
    EXPECT_EQ(back, d);
    ASSERT_TRUE(dtype_of_file_code(traits(d).file_code, &back)) << names[i];
    EXPECT_EQ(back, d);
    std::size_t row = 0;
    ASSERT_EQ(kvo_row_bytes(static_cast<kvo_dtype>(traits(d).c_dtype), 2, 8, &row), KVO_OK);
    EXPECT_EQ(row, is_quantized(d) ? 2 * 8 + 2 * 4 : 2 * 8 * bytes[i]) << names[i];
  }
  DType none = DType::kF32;
  EXPECT_FALSE(dtype_of_c(5, &none));
  EXPECT_FALSE(dtype_of_c(-1, &none));
  EXPECT_FALSE(dtype_of_file_code(5, &none));
  EXPECT_EQ(std::string(dtype_name(static_cast<DType>(7))), "?");
  EXPECT_EQ(dtype_size(static_cast<DType>(7)), 0u);
}

TEST(ElementTypes, GgmlNumbersFindTheirBlocks) {
  struct Block {
    std::uint32_t ggml;
    int elements;
    int bytes;
  };
  // As GGUF's specification sizes them.
  const Block known[] = {{0, 1, 4},   {1, 1, 2},      {30, 1, 2},     {8, 32, 34},   {2, 32, 18},
                         {3, 32, 20}, {12, 256, 144}, {13, 256, 176}, {14, 256, 210}};
  for (const Block& b : known) {
    EXPECT_EQ(ggml_block_elements(b.ggml), b.elements) << b.ggml;
    EXPECT_EQ(ggml_block_bytes(b.ggml), b.bytes) << b.ggml;
  }
  for (const std::uint32_t unserved : {6u, 7u, 9u, 10u, 11u, 15u, 16u, 39u, kNoGgml}) {
    EXPECT_EQ(ggml_block_elements(unserved), 0) << unserved;
  }
}

// visit() hands each type its own tag, and the filtered visits send every other value to
// otherwise(): a block type through visit(DType), a scalar one through visit_blocks.
TEST(ElementTypes, VisitHandsEachTypeItsOwnTag) {
  const auto index = [](auto t) { return static_cast<int>(decltype(t)::value); };
  const auto none = [] { return -1; };
  for (int i = 0; i < kElementTypes; ++i) {
    const auto type = static_cast<ElementType>(i);
    EXPECT_EQ(visit(type, index, none), i);
    EXPECT_EQ(visit(static_cast<DType>(i), index, none), is_block_type(type) ? -1 : i) << i;
    if (traits(type).ggml != kNoGgml) {
      EXPECT_EQ(visit_blocks(traits(type).ggml, index, none), is_block_type(type) ? i : -1) << i;
    }
  }
  EXPECT_EQ(visit(static_cast<ElementType>(kElementTypes), index, none), -1);
  EXPECT_EQ(visit(static_cast<DType>(200), index, none), -1);
  EXPECT_EQ(visit_blocks(6, index, none), -1);  // Q5_0: not a type the table has
  EXPECT_EQ(visit_blocks(kNoGgml, index, none), -1);
  static_assert(visit(ElementType::kQ4_K, index, none) == 8, "visit() is constexpr");
}

}  // namespace
}  // namespace kvo
