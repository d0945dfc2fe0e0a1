// Element types and backends: the small vocabulary shared by every public header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include "kvoffload/api.h"

namespace kvo {

// "MAJOR.MINOR.PATCH" of the library that is linked.
KVO_API const char* version();

// Storage type of K and V. The cache moves bytes and never converts, so only the row size
// matters to it; the name is for views, tools and errors. kFP8E4M3 and kInt8 are quantized rows:
// one byte per element and an f32 scale per (token, kv head), laid out as kvoffload/quant.hpp
// says. Weights are f32, f16 or bf16.
enum class DType { kF32, kF16, kBF16, kFP8E4M3, kInt8 };

// Bytes of one element (1 for the quantized dtypes, whose rows also hold their scales).
KVO_API std::size_t dtype_size(DType dtype);
KVO_API const char* dtype_name(DType dtype);
// Accepts "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16", "fp8"/"fp8_e4m3"/"e4m3" and
// "int8". Throws kvo::Error otherwise.
KVO_API DType parse_dtype(const std::string& name);
// The dtypes' names in order ("f32", "f16", "bf16", "fp8", "int8"), without the quantized ones
// (fp8, int8) when `quantized` is false: the choices a command line offers.
KVO_API std::vector<std::string> dtype_names(bool quantized = true);

// Where "device" memory lives and who moves the bytes.
// kCuda: a GPU; kHost: worker threads over host memory (no GPU needed); kAuto: kCuda when a GPU
// is usable and the library was built with CUDA, else kHost.
enum class BackendKind { kAuto, kCuda, kHost };

KVO_API const char* backend_name(BackendKind kind);
// Accepts "auto", "cuda", "host". Throws kvo::Error otherwise.
KVO_API BackendKind parse_backend(const std::string& name);

// Number of usable CUDA devices; 0 when built without CUDA or when there is no NVIDIA driver or
// no device. Throws kvo::Error(kDevice) for a driver too old for this build's CUDA runtime
// (naming the versions) or another failure of the CUDA setup, rather than reporting no device.
KVO_API int cuda_device_count();
// kAuto resolved: kCuda when a CUDA device is usable, else kHost (throwing as cuda_device_count
// does for a broken CUDA setup). Other kinds are returned as they are.
KVO_API BackendKind resolve_backend(BackendKind kind);

// Parses a byte size such as "24GiB", "512MiB", "1.5GB", "4096" (bytes). Binary (KiB, MiB, GiB,
// TiB) and decimal (KB, MB, GB, TB) units; throws kvo::Error for negative, malformed or
// overflowing sizes, naming the text it could not read.
KVO_API std::uint64_t parse_size(const std::string& text);
// "16.00 GiB", "512.0 KiB", "123 B": for messages and summaries.
KVO_API std::string format_bytes(std::uint64_t bytes);

}  // namespace kvo
