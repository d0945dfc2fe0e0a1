// kvoffload._native: the Python binding of the LibTorch adapter (kvoffload/torch.hpp), for the
// transformers Cache in tools/python/kvoffload/hf.py. It adds no logic of its own: it builds a
// CacheConfig from keyword arguments, forwards update/get_seq_length/reset/end_step, reads the
// stats, and turns kvo::Error into Python exceptions. This is the only file of the package that
// includes the Python and pybind11 headers (they come with the torch wheel).
//
// Errors: kvo::Error kInvalidArgument -> ValueError, kOutOfMemory -> MemoryError, every other code
// -> RuntimeError; the message is the library's, unchanged.
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <pybind11/stl.h>

#include "kvoffload/fingerprint.hpp"
#include "kvoffload/plan.hpp"
#include "kvoffload/torch.hpp"

namespace py = pybind11;

namespace {

using Adapter = kvo::torch::OffloadedStaticCache;

// Every field of CacheConfig the Python side sets; the rest keep their defaults (no reserved
// regions: the model's own memory is torch's business).
// states_dtype: "" for the stored dtype; for quantized K/V, the dtype the model computes in.
// static_shapes: update returns max_seq rows per batch row (kvoffload/torch.hpp).
// The shape and plan fields of a CacheConfig, for the cache and for planning one alone.
kvo::CacheConfig make_config(int layers, int kv_heads, int head_dim, int max_seq, int slots,
                             const std::string& dtype, int resident_layers, int ring_depth,
                             std::uint64_t device_budget, int v_head_dim, int kv_head_begin,
                             int model_kv_heads, int ranks_per_node,
                             std::uint64_t node_available_bytes) {
  kvo::CacheConfig config;
  config.layers = layers;
  config.kv_heads = kv_heads;
  config.head_dim = head_dim;
  config.v_head_dim = v_head_dim;
  config.max_seq = max_seq;
  config.slots = slots;
  config.dtype = kvo::parse_dtype(dtype);
  config.resident_layers = resident_layers;
  config.ring_depth = ring_depth;
  config.device_budget = device_budget;
  config.shard.kv_head_begin = kv_head_begin;
  config.shard.model_kv_heads = model_kv_heads;
  config.shard.ranks_per_node = ranks_per_node;
  config.shard.node_available_bytes = node_available_bytes;
  return config;
}

// Every field of CacheConfig the Python side sets; the rest keep their defaults (no reserved
// regions: the model's own memory is torch's business).
// states_dtype: "" for the stored dtype; for quantized K/V, the dtype the model computes in.
// static_shapes: update returns max_seq rows per batch row (kvoffload/torch.hpp).
std::unique_ptr<Adapter> make_cache(int layers, int kv_heads, int head_dim, int max_seq, int slots,
                                    const std::string& dtype, const std::string& backend,
                                    int device, int resident_layers, int ring_depth,
                                    std::uint64_t device_budget, std::uint32_t host_max_delay_us,
                                    std::uint64_t host_delay_seed, int v_head_dim,
                                    const std::string& states_dtype, bool static_shapes,
                                    int kv_head_begin, int model_kv_heads, int ranks_per_node,
                                    std::uint64_t node_available_bytes) {
  kvo::CacheConfig config = make_config(
      layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers, ring_depth, device_budget,
      v_head_dim, kv_head_begin, model_kv_heads, ranks_per_node, node_available_bytes);
  config.backend = kvo::parse_backend(backend);
  config.device = device;
  config.host.max_delay_us = host_max_delay_us;
  config.host.delay_seed = host_delay_seed;
  at::ScalarType states = at::ScalarType::Undefined;
  if (!states_dtype.empty()) {
    // torch's type of each unquantized dtype, in DType's order
    static_assert(static_cast<int>(kvo::DType::kF32) == 0 &&
                      static_cast<int>(kvo::DType::kF16) == 1 &&
                      static_cast<int>(kvo::DType::kBF16) == 2,
                  "kStates follows DType's order");
    constexpr at::ScalarType kStates[] = {at::kFloat, at::kHalf, at::kBFloat16};
    const int d = static_cast<int>(kvo::parse_dtype(states_dtype));
    if (d < 0 || d > 2) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                       "states_dtype is f32, f16 or bf16, not " + states_dtype);
    }
    states = kStates[d];
  }
  return std::make_unique<Adapter>(config, states, static_shapes);
}

py::dict plan_dict(const kvo::CachePlan& plan) {
  py::dict d;
  d["layers"] = plan.layers;
  d["resident_layers"] = plan.resident_layers;
  d["streamed_layers"] = plan.streamed_layers;
  d["ring_depth"] = plan.ring_depth;
  d["row_bytes"] = plan.row_bytes;
  d["tensor_bytes"] = plan.tensor_bytes;
  d["layer_bytes"] = plan.layer_bytes;
  d["resident_bytes"] = plan.resident_bytes;
  d["staging_bytes"] = plan.staging_bytes;
  d["reserved_bytes"] = plan.reserved_bytes;
  d["device_bytes"] = plan.device_bytes;
  d["host_bytes"] = plan.host_bytes;
  d["budget"] = plan.budget;
  d["kv_head_begin"] = plan.kv_head_begin;
  d["model_kv_heads"] = plan.model_kv_heads;
  d["ranks_per_node"] = plan.ranks_per_node;
  d["host_share_bytes"] = plan.host_share_bytes;
  return d;
}

py::dict stats_dict(const kvo::CacheStats& stats) {
  py::dict d;
  d["steps"] = stats.steps;
  d["h2d_bytes_total"] = stats.h2d_bytes_total;
  d["d2h_bytes_total"] = stats.d2h_bytes_total;
  d["h2d_bytes_last_step"] = stats.h2d_bytes_last_step;
  d["d2h_bytes_last_step"] = stats.d2h_bytes_last_step;
  d["acquire_wait_s"] = stats.acquire_wait_s;
  d["prefetch_reissues"] = stats.prefetch_reissues;
  d["reorder_bytes"] = stats.reorder_bytes;
  d["device_allocations"] = stats.device_allocations;
  d["plan"] = plan_dict(stats.plan);
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "kvoffload's native cache (the LibTorch adapter), for kvoffload.hf";

  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const kvo::Error& e) {
      switch (e.code()) {
        case kvo::ErrorCode::kInvalidArgument:
          PyErr_SetString(PyExc_ValueError, e.what());
          return;
        case kvo::ErrorCode::kOutOfMemory:
          PyErr_SetString(PyExc_MemoryError, e.what());
          return;
        default:
          PyErr_SetString(PyExc_RuntimeError, e.what());
          return;
      }
    }
  });

  m.def("parse_size", &kvo::parse_size, py::arg("text"),
        "Bytes in a size such as '24GiB', '512MiB', '1.5GB' or '4096'.");
  m.def("format_bytes", &kvo::format_bytes, py::arg("bytes"));
  m.def(
      "inspect_saved_context",
      [](const std::string& path) {
        const kvo::SavedContextInfo info = kvo::inspect_saved_context(path);
        py::dict d;
        d["layers"] = info.layers;
        d["kv_heads"] = info.kv_heads;
        d["head_dim"] = info.head_dim;
        d["v_head_dim"] = info.v_head_dim > 0 ? info.v_head_dim : info.head_dim;
        d["max_seq"] = info.max_seq;
        d["dtype"] = kvo::dtype_name(info.dtype);
        d["lengths"] = info.lengths;
        std::vector<std::string> models;
        for (const kvo::SlotContext& c : info.contexts) models.push_back(c.model);
        d["models"] = models;
        return d;
      },
      py::arg("path"), "What a saved-context file holds, from its headers alone.");
  m.def(
      "plan",
      [](int layers, int kv_heads, int head_dim, int max_seq, int slots, const std::string& dtype,
         int resident_layers, int ring_depth, std::uint64_t device_budget, int v_head_dim,
         int kv_head_begin, int model_kv_heads) {
        const kvo::CacheConfig config =
            make_config(layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers,
                        ring_depth, device_budget, v_head_dim, kv_head_begin, model_kv_heads, 1, 0);
        return plan_dict(kvo::plan_cache(config, device_budget));
      },
      py::arg("layers"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("max_seq"),
      py::arg("slots"), py::arg("dtype"), py::arg("resident_layers"), py::arg("ring_depth"),
      py::arg("device_budget"), py::arg("v_head_dim") = 0, py::arg("kv_head_begin") = 0,
      py::arg("model_kv_heads") = 0,
      "The plan a cache of these arguments would get under device_budget (0: unlimited), "
      "allocating nothing (kvo::plan_cache).");
  m.def("host_available_bytes", &kvo::host_available_bytes,
        "What this machine can give the pinned store (kvoffload/plan.hpp).");
  m.def("default_device_budget", &kvo::default_device_budget, py::arg("free_bytes"),
        py::arg("total_bytes"),
        "The budget a CUDA cache with none takes: free memory less max(1 GiB, 5% of total).");
  m.def("cuda_device_count", &kvo::cuda_device_count,
        "Usable CUDA devices for the library (0 when built without CUDA).");

  // A saved context's model fingerprint (kvoffload/fingerprint.hpp), written by the library so
  // that every writer states a fact in the same bytes.
  m.def("fingerprint_number", &kvo::fingerprint_number, py::arg("value"),
        "A finite number in the fingerprint's canonical text.");
  m.def(
      "fingerprint",
      [](const std::map<std::string, std::string>& fields) {
        kvo::Fingerprint f;
        for (const auto& [key, value] : fields) f.set(key, value);
        return f.text();
      },
      py::arg("fields"), "The fingerprint of these fields (each value its text).");
  m.def("fingerprint_field", &kvo::fingerprint_field, py::arg("text"), py::arg("key"),
        "A field's value in a fingerprint, '' when it has none.");
  m.def("is_fingerprint", &kvo::is_fingerprint, py::arg("text"));
  m.def(
      "bytes_digest",
      [](std::uintptr_t data, std::uint64_t bytes) {
        return kvo::WeightsDigest::bytes_digest(reinterpret_cast<const void*>(data), bytes);
      },
      py::arg("data"), py::arg("bytes"), py::call_guard<py::gil_scoped_release>(),
      "The digest of `bytes` host bytes at address `data` (a tensor's bytes).");
  py::class_<kvo::WeightsDigest::TensorBytes>(m, "TensorBytes",
                                              "The digest of bytes fed in pieces.")
      .def(py::init<>())
      .def(
          "update",
          [](kvo::WeightsDigest::TensorBytes& d, std::uintptr_t data, std::uint64_t bytes) {
            d.update(reinterpret_cast<const void*>(data), bytes);
          },
          py::arg("data"), py::arg("bytes"), py::call_guard<py::gil_scoped_release>())
      .def("digest", &kvo::WeightsDigest::TensorBytes::digest);
  m.def(
      "weights_digest",
      [](const std::vector<
          std::tuple<std::string, std::string, std::vector<std::int64_t>, std::string>>& tensors) {
        kvo::WeightsDigest digest;
        for (const auto& [name, dtype, shape, bytes] : tensors) {
          digest.add_digest(name, dtype, shape, bytes);
        }
        return digest.hex();
      },
      py::arg("tensors"),
      "The weights' digest of (name, dtype, shape, bytes' digest) tuples, in any order.");
  m.def(
      "tokenizer_digest",
      [](const std::string& dir) {
        return kvo::files_digest(dir, std::vector<std::string>(std::begin(kvo::kTokenizerFiles),
                                                               std::end(kvo::kTokenizerFiles)));
      },
      py::arg("dir"), "The digest of a tokenizer's files in dir, '' when it has none.");

  py::class_<Adapter>(m, "Cache")
      .def(py::init(&make_cache), py::arg("layers"), py::arg("kv_heads"), py::arg("head_dim"),
           py::arg("max_seq"), py::arg("slots"), py::arg("dtype"), py::arg("backend"),
           py::arg("device") = 0, py::arg("resident_layers") = kvo::kAutoResidentLayers,
           py::arg("ring_depth") = 2, py::arg("device_budget") = 0,
           py::arg("host_max_delay_us") = 0, py::arg("host_delay_seed") = 0,
           py::arg("v_head_dim") = 0, py::arg("states_dtype") = "",
           py::arg("static_shapes") = false, py::arg("kv_head_begin") = 0,
           py::arg("model_kv_heads") = 0, py::arg("ranks_per_node") = 1,
           py::arg("node_available_bytes") = 0,
           "Plans and allocates every byte of the cache (see kvoffload/cache.hpp).")
      // The GIL is released while the adapter works: on CUDA it only enqueues, on the host
      // backend it copies on the calling thread.
      .def(
          "update",
          [](Adapter& cache, const at::Tensor& key_states, const at::Tensor& value_states,
             std::int64_t layer_idx, const std::optional<at::Tensor>& cache_position) {
            return cache.update(key_states, value_states, layer_idx,
                                cache_position.value_or(at::Tensor()));
          },
          py::arg("key_states"), py::arg("value_states"), py::arg("layer_idx"),
          py::arg("cache_position") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("get_seq_length", &Adapter::get_seq_length, py::call_guard<py::gil_scoped_release>())
      .def("get_max_cache_shape", &Adapter::get_max_cache_shape)
      .def("reset", &Adapter::reset, py::call_guard<py::gil_scoped_release>())
      .def("end_step", &Adapter::end_step, py::call_guard<py::gil_scoped_release>())
      // Drops the last rows of every slot: commits the open step (it must be complete), then
      // truncates between steps, where the C++ API allows it.
      .def(
          "truncate",
          [](Adapter& cache, int length) {
            cache.end_step();
            for (int s = 0; s < cache.cache().config().slots; ++s) {
              cache.cache().truncate_slot(s, length);
            }
          },
          py::arg("length"), py::call_guard<py::gil_scoped_release>())
      // Beam search: slot s takes slot source[s]'s rows (commits the open step first).
      .def(
          "reorder",
          [](Adapter& cache, const std::vector<int>& source) {
            cache.end_step();
            cache.cache().reorder_slots(source);
          },
          py::arg("source"), py::call_guard<py::gil_scoped_release>())
      // Saved contexts: every slot, in order, to one file (written atomically); load replaces
      // every slot (an open step is dropped first) and returns each slot's token ids.
      .def(
          "save",
          [](Adapter& cache, const std::string& path,
             const std::vector<std::vector<std::int32_t>>& tokens, const std::string& model) {
            cache.end_step();
            const int slots = cache.cache().config().slots;
            if (tokens.size() > static_cast<std::size_t>(slots)) {
              throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                               "tokens has " + std::to_string(tokens.size()) +
                                   " rows, and the cache holds " + std::to_string(slots) +
                                   "; nothing was saved");
            }
            std::vector<int> order;
            std::vector<kvo::SlotContext> contexts;
            for (int s = 0; s < slots; ++s) {
              order.push_back(s);
              contexts.push_back({s < static_cast<int>(tokens.size())
                                      ? tokens[static_cast<std::size_t>(s)]
                                      : std::vector<std::int32_t>(),
                                  model});
            }
            cache.cache().save_slots(order, path, contexts);
          },
          py::arg("path"), py::arg("tokens"), py::arg("model"),
          py::call_guard<py::gil_scoped_release>())
      .def(
          "load",
          [](Adapter& cache, const std::string& path, const std::string& model) {
            cache.end_step();
            std::vector<int> order;
            for (int s = 0; s < cache.cache().config().slots; ++s) order.push_back(s);
            std::vector<std::vector<std::int32_t>> tokens;
            for (kvo::SlotContext& c : cache.cache().load_slots(order, path, model)) {
              tokens.push_back(std::move(c.tokens));
            }
            return tokens;
          },
          py::arg("path"), py::arg("model"), py::call_guard<py::gil_scoped_release>())
      .def("stats", [](Adapter& cache) { return stats_dict(cache.cache().stats()); })
      .def(
          "synchronize", [](Adapter& cache) { cache.cache().synchronize(); },
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "backend", [](Adapter& cache) { return kvo::backend_name(cache.cache().backend()); });
}
