// kvo-gguf: what a GGUF file holds, read and checked as kvo-generate will read it (the header,
// the metadata, the tensor table and where each tensor lies): a summary, or everything as JSON.
// A file that lies is refused naming the field (model/checkpoint/gguf.hpp).
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"

namespace {

struct GgufArgs {
  std::string file;
  bool json = false;
  bool arrays = false;
  bool config = false;
  std::string dequantize;
  std::string out;
};

void declare(CLI::App& app, GgufArgs& a) {
  kvo::cli::describe(app,
                     "What a GGUF file (version 3) holds: its metadata and its tensors (name, "
                     "ggml type, dimensions in ggml's order, offset and bytes), each checked: "
                     "sizes, offsets, alignment, overlaps.");
  kvo::cli::add_text(app, "--model", a.file, "FILE", "the .gguf file")->required();
  kvo::cli::add_flag(app, "--json", a.json,
                     "everything as one JSON object on stdout (strings as the file holds them, "
                     "bytes that are not UTF-8 as U+FFFD)");
  kvo::cli::add_flag(app, "--arrays", a.arrays,
                     "with --json: every array's elements (default: its type and length)");
  kvo::cli::add_flag(app, "--config", a.config,
                     "the model as config.json would describe it (the metadata mapped as "
                     "transformers maps it, then checked as kvo-generate checks a config.json)");
  kvo::cli::add_text(app, "--dequantize", a.dequantize, "TENSOR",
                     "write this tensor's elements as little-endian f32 to --out (types F32, F16, "
                     "BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)");
  kvo::cli::add_text(app, "--out", a.out, "FILE", "with --dequantize: where the f32 go");
}

// The tensor's elements as f32, block by block (model/checkpoint/ggml_blocks.hpp).
std::string dequantized(const kvo::model::GgufTensor& t) {
  namespace blocks = kvo::model::blocks;
  const int per_block = blocks::block_elements(t.type->id);
  if (per_block == 0) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     "tensor " + kvo::printable(t.name) + " is " + t.type->name +
                         ", which is not dequantized (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, "
                         "Q5_K and Q6_K are)");
  }
  const auto count = static_cast<std::size_t>(t.elements());
  std::string out(count * sizeof(float), '\0');
  auto* values = reinterpret_cast<float*>(out.data());
  const auto* block = reinterpret_cast<const std::uint8_t*>(t.data);
  for (std::size_t at = 0; at < count; at += static_cast<std::size_t>(per_block)) {
    blocks::dequantize_block(t.type->id, block, values + at);
    block += blocks::block_bytes(t.type->id);
  }
  return out;
}

// A float as JSON: non-finite values as strings, which JSON has no numbers for.
nlohmann::ordered_json number(double v) {
  if (std::isfinite(v)) return v;
  return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
}

nlohmann::ordered_json value_json(const kvo::model::GgufValue& v, bool arrays) {
  using kvo::model::GgufValueType;
  nlohmann::ordered_json j;
  j["type"] = kvo::model::gguf_value_type_name(v.type);
  if (v.type == GgufValueType::kString) {
    j["value"] = v.text;
  } else if (v.type == GgufValueType::kArray) {
    j["element"] = kvo::model::gguf_value_type_name(v.element);
    j["count"] = v.count;
    if (arrays) {
      auto& values = j["value"] = nlohmann::ordered_json::array();
      for (const std::string& s : v.strings) values.push_back(s);
      for (double f : v.floats) values.push_back(number(f));
      for (std::int64_t i : v.integers) values.push_back(i);
    }
  } else if (v.type == GgufValueType::kUint64) {
    j["value"] = v.unsigned_integer;
  } else if (v.type == GgufValueType::kBool) {
    j["value"] = v.integer != 0;
  } else if (v.is_integer) {
    j["value"] = v.integer;
  } else {
    j["value"] = number(v.floating);
  }
  return j;
}

int run(const GgufArgs& a) {
  if (a.dequantize.empty() != a.out.empty()) {
    throw kvo::cli::UsageError("--dequantize and --out go together");
  }
  const kvo::model::GgufFile file(a.file);
  const kvo::model::GgufContents& c = file.contents();
  if (a.config) {
    kvo::model::gguf_model_config(file);  // refused here as kvo-generate would refuse it
    std::cout << kvo::model::gguf_config_json(file) << "\n";
    return kvo::cli::kExitSuccess;
  }
  if (!a.dequantize.empty()) {
    kvo::cli::write_output_file(a.out, dequantized(file.tensor(a.dequantize)), "--out");
    return kvo::cli::kExitSuccess;
  }
  if (a.json) {
    nlohmann::ordered_json out;
    out["file"] = file.path();
    out["bytes"] = file.size();
    out["version"] = c.version;
    out["alignment"] = c.alignment;
    out["data_offset"] = c.data_offset;
    auto& metadata = out["metadata"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : c.metadata) metadata[key] = value_json(value, a.arrays);
    auto& tensors = out["tensors"] = nlohmann::ordered_json::array();
    for (const kvo::model::GgufTensor& t : c.tensors) {
      tensors.push_back({{"name", t.name},
                         {"type", t.type->name},
                         {"dims", t.dims},
                         {"offset", t.offset},
                         {"bytes", t.bytes}});
    }
    // Strings as the file holds them; bytes that are not UTF-8 become U+FFFD.
    std::cout << out.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return kvo::cli::kExitSuccess;
  }
  std::uint64_t data = 0;
  std::map<std::string, int> types;
  for (const kvo::model::GgufTensor& t : c.tensors) {
    data += t.bytes;
    ++types[t.type->name];
  }
  std::cout << file.path() << ": GGUF version " << c.version << ", " << c.metadata.size()
            << " metadata keys, " << c.tensors.size() << " tensors (";
  bool first = true;
  for (const auto& [name, count] : types) {
    std::cout << (first ? "" : ", ") << count << " " << name;
    first = false;
  }
  std::cout << "), " << data << " bytes of tensor data, alignment " << c.alignment << "\n";
  if (file.has("general.architecture") &&
      file.at("general.architecture").type == kvo::model::GgufValueType::kString) {
    std::cout << "architecture: " << kvo::printable(file.text("general.architecture")) << "\n";
  }
  if (file.has("general.name") &&
      file.at("general.name").type == kvo::model::GgufValueType::kString) {
    std::cout << "name: " << kvo::printable(file.text("general.name")) << "\n";
  }
  return kvo::cli::kExitSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-gguf");
  GgufArgs args;
  declare(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return run(args); });
}
