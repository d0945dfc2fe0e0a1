// A model is refused before anything is allocated: config fields are integers within stated
// bounds, the config must match its checkpoint's tensor table, and the whole plan must fit this
// machine's memory. Long work reports progress in small steps.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "expect_error.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/model_test_util.hpp"
#include "prefetch/backend/host_backend.hpp"

namespace kvo::model {
namespace {

using kvo::testing::expect_error;
using prefetch::HostBackend;

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "kvo_limits_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// config.json of small_config() with one field's value replaced by `value` (JSON text).
std::string config_with(const std::string& field, const std::string& value) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(to_config_json(testing::small_config()));
  j[field] = nlohmann::ordered_json::parse(value);
  return j.dump();
}

// A checkpoint of small_config() (3 layers) in `dir`, with `config` as its config.json.
void write_model(const std::string& dir, const std::string& config) {
  const ModelConfig c = testing::small_config();
  const WeightLayout layout(c, c.dtype);
  std::vector<TensorToWrite> tensors;
  for (const auto& e : layout.entries()) {
    tensors.push_back({e.name, c.dtype, e.shape, std::vector<std::byte>(layout.entry_bytes(e))});
  }
  write_safetensors(dir + "/model.safetensors", tensors);
  write_file(dir + "/config.json", config);
}

// Runs `make` (which must throw `code` with `needle`) and checks that no host-backend allocation
// happened meanwhile: the refusal came before anything was allocated.
void expect_refused_before_allocating(const std::function<void()>& make, ErrorCode code,
                                      const std::string& needle) {
  const std::uint64_t before = HostBackend::allocations_in_process();
  expect_error(make, code, needle);
  EXPECT_EQ(HostBackend::allocations_in_process(), before) << "allocated before refusing";
}

TEST(ModelLimits, IntegerFieldsStateTheirBounds) {
  const struct {
    const char* field;
    const char* value;
    const char* needle;
  } cases[] = {
      {"vocab_size", "1099511627776",
       "vocab_size: must be an integer from 1 to 4194304, got 1099511627776"},
      {"intermediate_size", "1099511627776",
       "intermediate_size: must be an integer from 1 to 1048576"},
      {"num_hidden_layers", "100000",
       "num_hidden_layers: must be an integer from 1 to 1024, got 100000"},
      {"hidden_size", "0", "hidden_size: must be an integer from 1 to 65536, got 0"},
      {"num_attention_heads", "-4",
       "num_attention_heads: must be an integer from 1 to 1024, got -4"},
      {"head_dim", "4096", "head_dim: must be an integer from 2 to 1024"},
      // A float is not an integer, even a whole one: 1e9 and 2.0 are refused, not rounded.
      {"vocab_size", "1e9", "vocab_size: must be an integer from 1 to 4194304, got 1000000000.0"},
      {"num_hidden_layers", "2.0", "num_hidden_layers: must be an integer"},
      {"num_hidden_layers", "\"3\"", "num_hidden_layers: must be an integer"},
      {"rms_norm_eps", "\"small\"", "rms_norm_eps: must be a finite number"},
      {"tie_word_embeddings", "1", "tie_word_embeddings: must be true or false"},
  };
  for (const auto& c : cases) {
    expect_error([&] { parse_model_config(config_with(c.field, c.value), "config.json"); },
                 ErrorCode::kInvalidArgument, c.needle);
  }
  // A repeated key is refused, whichever value would win.
  expect_error([] { parse_model_config(R"({"vocab_size": 10, "vocab_size": 20})", "c.json"); },
               ErrorCode::kInvalidArgument, "the key \"vocab_size\" appears twice");
  // validate() holds presets and tool-made configs to the same bounds.
  ModelConfig big = testing::small_config();
  big.vocab_size = ModelLimits::kVocab + 1;
  expect_error([&] { validate(big); }, ErrorCode::kInvalidArgument,
               "vocab_size must be from 1 to 4194304, got 4194305");
  // A directory is not a config.json.
  const std::string dir = temp_dir("config_dir");
  ::mkdir((dir + "/config.json").c_str(), 0755);
  expect_error([&] { load_model_config(dir + "/config.json"); }, ErrorCode::kInvalidArgument,
               "is a directory, not a regular file");
}

TEST(ModelLimits, AConfigThatDoesNotMatchItsCheckpointIsRefusedBeforeAllocating) {
  const std::string dir = temp_dir("mismatch");
  // More layers than the checkpoint holds (within the bound, so only the table can tell).
  write_model(dir, config_with("num_hidden_layers", "1000"));
  expect_refused_before_allocating(
      [&] {
        Decoder d(load_model_config(dir + "/config.json"), WeightSource{dir, 0},
                  testing::host_options(64));
      },
      ErrorCode::kInvalidArgument,
      "config.json has num_hidden_layers 1000 but the checkpoint holds 3 layers (model.layers.0 "
      "to model.layers.2)");
  // Fewer layers than the checkpoint holds.
  write_model(dir, config_with("num_hidden_layers", "2"));
  expect_refused_before_allocating(
      [&] {
        Decoder d(load_model_config(dir + "/config.json"), WeightSource{dir, 0},
                  testing::host_options(64));
      },
      ErrorCode::kInvalidArgument, "num_hidden_layers 2 but the checkpoint holds 3 layers");
  // A larger vocabulary than the embedding holds.
  write_model(dir, config_with("vocab_size", "1000000"));
  expect_refused_before_allocating(
      [&] {
        Decoder d(load_model_config(dir + "/config.json"), WeightSource{dir, 0},
                  testing::host_options(64));
      },
      ErrorCode::kInvalidArgument,
      "\"model.embed_tokens.weight\" has shape [300, 64], the config needs [1000000, 64]");
  // The matching config loads, and allocates: the counter above is not blind.
  write_model(dir, to_config_json(testing::small_config()));
  const std::uint64_t before = HostBackend::allocations_in_process();
  Decoder ok(load_model_config(dir + "/config.json"), WeightSource{dir, 0},
             testing::host_options(64));
  EXPECT_EQ(ok.config().layers, 3);
  EXPECT_GT(HostBackend::allocations_in_process(), before);
}

TEST(ModelLimits, APlanBeyondThisMachinesMemoryIsRefusedBeforeAllocating) {
  // Llama-3-8B's shape at 4M tokens and 8 slots on the host backend: the "device" arena alone
  // is 4 TiB of host memory. Both figures and a remedy that works on the host backend.
  DecoderOptions o;
  o.backend = BackendKind::kHost;
  o.max_seq = 1 << 22;
  o.slots = 8;
  o.max_prompt = 1;
  expect_refused_before_allocating(
      [&] {
        Decoder d(preset("llama3-8b"), WeightSource{"", 1}, o);
      },
      ErrorCode::kOutOfMemory, "for the device arena, which is host memory on the host backend");
  try {
    Decoder d(preset("llama3-8b"), WeightSource{"", 1}, o);
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("the plan needs 4.0"), std::string::npos) << m;
    EXPECT_NE(m.find("TiB"), std::string::npos) << m;
    EXPECT_NE(m.find("available: missing"), std::string::npos) << m;
    EXPECT_NE(m.find("keeping layers resident does not reduce it"), std::string::npos) << m;
    EXPECT_EQ(m.find("keep more layers resident"), std::string::npos) << m;
  }
  // Streaming every layer moves the bytes to the KV store: still refused, with both parts named.
  o.resident_layers = 0;
  expect_refused_before_allocating(
      [&] {
        Decoder d(preset("llama3-8b"), WeightSource{"", 1}, o);
      },
      ErrorCode::kOutOfMemory, "for the KV store) but this machine has");
}

TEST(Progress, AHostPrefillReportsEveryChunkOfEveryLayer) {
  const ModelConfig c = testing::small_config();
  DecoderOptions o = testing::host_options(100);
  o.chunk = 16;
  Decoder d(c, WeightSource{"", 3}, o);
  std::vector<std::pair<std::int64_t, std::int64_t>> calls;
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  d.prefill(0, testing::random_prompt(70, c.vocab_size, 1), logits.data(),
            [&](std::int64_t done, std::int64_t total) { calls.emplace_back(done, total); });
  // 70 tokens in chunks of 16: 5 chunks per layer, 3 layers.
  ASSERT_EQ(calls.size(), 15u);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].first, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(calls[i].second, 15);
  }
}

TEST(Progress, WeightsReportEachTensorDrawnOrLoaded) {
  const ModelConfig c = testing::small_config();
  const auto tensors = static_cast<std::int64_t>(WeightLayout(c, c.dtype).entries().size());
  std::int64_t calls = 0, last = 0;
  const auto progress = [&](std::int64_t done, std::int64_t total) {
    ++calls;
    EXPECT_EQ(done, last + 1);
    EXPECT_EQ(total, tensors);
    last = done;
  };
  Decoder drawn(c, WeightSource{"", 3}, testing::host_options(16), progress);
  EXPECT_EQ(calls, tensors);
  const std::string dir = temp_dir("progress");
  write_model(dir, to_config_json(c));
  calls = last = 0;
  Decoder loaded(c, WeightSource{dir, 0}, testing::host_options(16), progress);
  EXPECT_EQ(calls, tensors);
}

}  // namespace
}  // namespace kvo::model
