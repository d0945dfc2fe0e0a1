// Every element type the project stores, once: the dtypes of the public API (kvo::DType, the C
// ABI's kvo_dtype) and the GGUF block types the model reads (ggml's numbers). Each row states the
// name the tools print, the block (one element for a scalar type) and its bytes, ggml's number,
// the C enum's value and a saved context's file code; the static_asserts below tie the numbers
// that three enums and one file format share, so that none can drift from another. Header-only
// and constexpr, usable in device code: traits() is the one dispatch over the type.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvoffload/kvoffload.h"
#include "kvoffload/types.hpp"

#if defined(__CUDACC__)
#define KVO_ELEMENT_HD __host__ __device__ constexpr
// Before a __host__ __device__ template that calls what its caller hands it: a host caller's
// lambda is host code, a kernel's is device code, and each instantiation is only ever one of them.
#define KVO_ELEMENT_EITHER_SIDE _Pragma("nv_exec_check_disable")
#else
#define KVO_ELEMENT_HD constexpr
#define KVO_ELEMENT_EITHER_SIDE
#endif
// visit() and its kin are inlined into every caller, so that a caller compiled for several CPU
// levels (target_clones) gets each type's code compiled at each level.
#if defined(__GNUC__)
#define KVO_ELEMENT_VISIT KVO_ELEMENT_HD inline __attribute__((always_inline))
#else
#define KVO_ELEMENT_VISIT KVO_ELEMENT_HD inline
#endif
// The same for a lambda handed to visit() from a function that is inlined into such callers.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define KVO_ELEMENT_LAMBDA __attribute__((always_inline))
#else
#define KVO_ELEMENT_LAMBDA
#endif

namespace kvo {

// The dtypes first, in DType's order (element_type(DType) is a cast), then the block types.
enum class ElementType : std::uint8_t {
  kF32,
  kF16,
  kBF16,
  kFP8E4M3,
  kInt8,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};
inline constexpr int kElementTypes = 11;

inline constexpr std::uint32_t kNoGgml = 0xFFFFFFFFu;

struct ElementTraits {
  const char* name = "?";        // "f32", "bf16", "fp8", "Q4_K": as the tools print it
  int block_elements = 0;        // 1 for a scalar type
  int block_bytes = 0;           // of one block (one element for a scalar type)
  std::uint32_t ggml = kNoGgml;  // ggml's type number in a GGUF file; kNoGgml: none
  int c_dtype = -1;              // kvo_dtype's value; -1: not a dtype of the C ABI
  int file_code = -1;            // a saved context's dtype code; -1: never saved
};

KVO_ELEMENT_HD ElementTraits traits(ElementType type) {
  switch (type) {
    case ElementType::kF32:
      return {"f32", 1, 4, 0, KVO_DTYPE_F32, 0};
    case ElementType::kF16:
      return {"f16", 1, 2, 1, KVO_DTYPE_F16, 1};
    case ElementType::kBF16:
      return {"bf16", 1, 2, 30, KVO_DTYPE_BF16, 2};
    case ElementType::kFP8E4M3:
      return {"fp8", 1, 1, kNoGgml, KVO_DTYPE_FP8_E4M3, 3};
    case ElementType::kInt8:
      return {"int8", 1, 1, kNoGgml, KVO_DTYPE_INT8, 4};
    case ElementType::kQ8_0:
      return {"Q8_0", 32, 34, 8};
    case ElementType::kQ4_0:
      return {"Q4_0", 32, 18, 2};
    case ElementType::kQ4_1:
      return {"Q4_1", 32, 20, 3};
    case ElementType::kQ4_K:
      return {"Q4_K", 256, 144, 12};
    case ElementType::kQ5_K:
      return {"Q5_K", 256, 176, 13};
    case ElementType::kQ6_K:
      return {"Q6_K", 256, 210, 14};
  }
  return {};
}

// A type as a compile-time constant: what visit() hands the code it calls.
template <ElementType kType>
struct ElementTag {
  static constexpr ElementType value = kType;
};

// The one run-time dispatch over element types: f(ElementTag<type>()), so that inside f the type
// is a compile-time constant and each type's code is its own instantiation; otherwise() for a
// value outside the table (an int cast from a corrupt source). Every per-type kernel and
// conversion is reached through here or through traits().
KVO_ELEMENT_EITHER_SIDE
template <typename F, typename G>
KVO_ELEMENT_VISIT decltype(auto) visit(ElementType type, F&& f, G&& otherwise) {
  using T = ElementType;
  switch (type) {
    case T::kF32:
      return f(ElementTag<T::kF32>());
    case T::kF16:
      return f(ElementTag<T::kF16>());
    case T::kBF16:
      return f(ElementTag<T::kBF16>());
    case T::kFP8E4M3:
      return f(ElementTag<T::kFP8E4M3>());
    case T::kInt8:
      return f(ElementTag<T::kInt8>());
    case T::kQ8_0:
      return f(ElementTag<T::kQ8_0>());
    case T::kQ4_0:
      return f(ElementTag<T::kQ4_0>());
    case T::kQ4_1:
      return f(ElementTag<T::kQ4_1>());
    case T::kQ4_K:
      return f(ElementTag<T::kQ4_K>());
    case T::kQ5_K:
      return f(ElementTag<T::kQ5_K>());
    case T::kQ6_K:
      return f(ElementTag<T::kQ6_K>());
  }
  return otherwise();
}

// A type of several elements per block (ggml's quantized blocks).
KVO_ELEMENT_HD bool is_block_type(ElementType type) {
  return traits(type).block_elements > 1;
}

KVO_ELEMENT_HD ElementType element_type(DType dtype) {
  return static_cast<ElementType>(static_cast<int>(dtype));
}
// The dtype of a scalar type: element_type's inverse. REQUIRES: !is_block_type(type).
KVO_ELEMENT_HD DType dtype_of(ElementType type) {
  return static_cast<DType>(static_cast<int>(type));
}
KVO_ELEMENT_HD ElementTraits traits(DType dtype) {
  return traits(element_type(dtype));
}
// Bytes of one element of a dtype (1 for the quantized K/V dtypes, whose rows also hold scales).
KVO_ELEMENT_HD std::size_t element_bytes(DType dtype) {
  return static_cast<std::size_t>(traits(dtype).block_bytes);
}

// The type ggml numbers `ggml`; false where none of the table's is.
KVO_ELEMENT_HD bool element_type_of_ggml(std::uint32_t ggml, ElementType* type) {
  if (ggml == kNoGgml) return false;
  for (int i = 0; i < kElementTypes; ++i) {
    if (traits(static_cast<ElementType>(i)).ggml == ggml) {
      *type = static_cast<ElementType>(i);
      return true;
    }
  }
  return false;
}
// The block of ggml's type `ggml`: its elements and bytes; 0 for a type the table lacks.
KVO_ELEMENT_HD int ggml_block_elements(std::uint32_t ggml) {
  ElementType t = ElementType::kF32;
  return element_type_of_ggml(ggml, &t) ? traits(t).block_elements : 0;
}
KVO_ELEMENT_HD int ggml_block_bytes(std::uint32_t ggml) {
  ElementType t = ElementType::kF32;
  return element_type_of_ggml(ggml, &t) ? traits(t).block_bytes : 0;
}

namespace element_detail {

// f(tag) for a type of which kBlocks says whether it is a block type, otherwise() for the rest.
template <bool kBlocks, typename F, typename G>
struct Only {
  F& f;
  G& otherwise;
  KVO_ELEMENT_EITHER_SIDE
  template <typename Tag>
  KVO_ELEMENT_VISIT decltype(auto) operator()(Tag tag) const {
    if constexpr (is_block_type(Tag::value) == kBlocks) {
      return f(tag);
    } else {
      return otherwise();
    }
  }
};

}  // namespace element_detail

// visit() over the block types alone, by ggml's number: f(ElementTag<type>()) for a quantized
// block type of the table, otherwise() for any other number (a scalar type among them).
KVO_ELEMENT_EITHER_SIDE
template <typename F, typename G>
KVO_ELEMENT_VISIT decltype(auto) visit_blocks(std::uint32_t ggml, F&& f, G&& otherwise) {
  ElementType type = ElementType::kF32;
  if (!element_type_of_ggml(ggml, &type)) return otherwise();
  return visit(type, element_detail::Only<true, F, G>{f, otherwise}, otherwise);
}

// visit() over the dtypes alone (kvo::DType's values); otherwise() for any other value.
KVO_ELEMENT_EITHER_SIDE
template <typename F, typename G>
KVO_ELEMENT_VISIT decltype(auto) visit(DType dtype, F&& f, G&& otherwise) {
  return visit(element_type(dtype), element_detail::Only<false, F, G>{f, otherwise}, otherwise);
}

// The dtype whose row has `value` in `field` (c_dtype, file_code); false where none has.
constexpr bool dtype_where(int ElementTraits::*field, int value, DType* dtype) {
  for (int i = 0; i <= static_cast<int>(DType::kInt8); ++i) {
    if (traits(static_cast<ElementType>(i)).*field == value) {
      *dtype = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}
// The dtype whose C enum value is `c_dtype`; false for any other int.
constexpr bool dtype_of_c(int c_dtype, DType* dtype) {
  return dtype_where(&ElementTraits::c_dtype, c_dtype, dtype);
}
// The dtype a saved context codes as `code`; false for any other value.
constexpr bool dtype_of_file_code(int code, DType* dtype) {
  return dtype_where(&ElementTraits::file_code, code, dtype);
}

namespace element_checks {

// DType's values are the table's first rows, each with its C enum and file code.
constexpr bool dtypes_agree() {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8};
  const int c[] = {KVO_DTYPE_F32, KVO_DTYPE_F16, KVO_DTYPE_BF16, KVO_DTYPE_FP8_E4M3,
                   KVO_DTYPE_INT8};
  for (int i = 0; i < 5; ++i) {
    const ElementTraits t = traits(all[i]);
    if (static_cast<int>(all[i]) != i || t.c_dtype != c[i] || t.file_code != i) return false;
    if (t.block_elements != 1) return false;
  }
  return traits(static_cast<ElementType>(5)).c_dtype < 0;  // the first block type has none
}
static_assert(dtypes_agree(), "DType, kvo_dtype and the saved-context codes disagree");

// Each ggml number once, and every row named and sized.
constexpr bool rows_whole() {
  for (int i = 0; i < kElementTypes; ++i) {
    const ElementTraits t = traits(static_cast<ElementType>(i));
    if (t.block_elements <= 0 || t.block_bytes <= 0 || t.name[0] == '?') return false;
    for (int j = 0; j < i; ++j) {
      if (t.ggml != kNoGgml && traits(static_cast<ElementType>(j)).ggml == t.ggml) return false;
    }
  }
  return true;
}
static_assert(rows_whole(), "an element type without a name or a block, or a ggml number twice");

}  // namespace element_checks

}  // namespace kvo
