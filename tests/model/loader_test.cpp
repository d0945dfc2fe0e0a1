// config.json and safetensors: what loads, and the error each malformed input gives.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kvoffload/error.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/model_test_util.hpp"
#include "model/reference_forward.hpp"

namespace kvo::model {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "kvo_loader_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Expects `fn` to throw kvo::Error whose message holds every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const char* part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
    }
  }
}

// A checkpoint of small_config() as kvo-make-model writes it; `shards` files.
std::string write_checkpoint(const std::string& name, const ModelConfig& c, int shards,
                             std::uint64_t seed) {
  const std::string dir = temp_dir(name);
  write_file(dir + "/config.json", to_config_json(c));
  const WeightLayout layout(c, c.dtype);
  const auto& entries = layout.entries();
  std::string index = "{\"weight_map\": {";
  const std::size_t per = (entries.size() + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    const std::string file =
        shards == 1 ? "model.safetensors" : "part-" + std::to_string(s) + ".safetensors";
    std::vector<TensorToWrite> tensors;
    for (std::size_t i = s * per; i < std::min(entries.size(), (s + 1) * per); ++i) {
      TensorToWrite t{entries[i].name, layout.dtype(), entries[i].shape, {}};
      t.data.resize(layout.entry_bytes(entries[i]));
      fill_synthetic(layout, entries[i], seed, t.data.data());
      index += std::string(i ? "," : "") + "\"" + t.name + "\": \"" + file + "\"";
      tensors.push_back(std::move(t));
    }
    write_safetensors(dir + "/" + file, tensors);
  }
  if (shards > 1) write_file(dir + "/model.safetensors.index.json", index + "}}");
  return dir;
}

TEST(ModelConfig, ParsesHuggingFaceFields) {
  const ModelConfig c = parse_model_config(R"({
    "architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 128,
    "intermediate_size": 300, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false})",
                                           "test");
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.rope_theta, 1e6);
  // rope_parameters (newer transformers) carries theta and the llama3 scaling.
  const ModelConfig l = parse_model_config(R"({"architectures": ["LlamaForCausalLM"],
    "vocab_size": 10, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1,
    "num_attention_heads": 4, "head_dim": 32, "rope_parameters": {"rope_type": "llama3",
    "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}})",
                                           "test");
  EXPECT_EQ(l.kv_heads, 4);
  EXPECT_EQ(l.head_dim, 32);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(l.rope_scaling.factor, 8.0);
  // What to_config_json writes reads back the same.
  const ModelConfig t = preset("tiny");
  const ModelConfig back = parse_model_config(to_config_json(t), "round trip");
  EXPECT_EQ(back.hidden_size, t.hidden_size);
  EXPECT_EQ(back.kv_heads, t.kv_heads);
  EXPECT_EQ(back.tie_word_embeddings, t.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(back.rope_scaling.original_max_position, t.rope_scaling.original_max_position);
  EXPECT_EQ(back.dtype, t.dtype);
}

// Gemma 2 and 3's fields, as transformers' classes read them: the defaults of each class where
// config.json is silent (soft-caps 50 and 30 for Gemma 2, none for Gemma 3; every other layer
// windowed, or five in six; head_dim 256; tied embeddings); Gemma 3's two rotations from
// rope_parameters keyed by layer type or from the older rope_theta, rope_scaling and
// rope_local_base_freq, the same either way; what cannot be served refused by name; and the
// gemma3-12b preset written by to_config_json and read back the same.
TEST(ModelConfig, GemmaFieldsReadAsTransformersReadsThem) {
  const std::string shape = R"("vocab_size": 10, "hidden_size": 64, "intermediate_size": 100,
      "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2)";
  const auto gemma2 = [&](const std::string& extra) {
    return parse_model_config(R"({"architectures": ["Gemma2ForCausalLM"], )" + shape + extra + "}",
                              "g2.json");
  };
  const ModelConfig g2 = gemma2("");
  EXPECT_EQ(g2.head_dim, 256);
  EXPECT_EQ(g2.attn_softcap, 50);
  EXPECT_EQ(g2.final_softcap, 30);
  EXPECT_FLOAT_EQ(g2.query_pre_attn_scalar, 256);
  EXPECT_EQ(g2.hidden_act, Activation::kGeluTanh);
  EXPECT_TRUE(g2.tie_word_embeddings);
  EXPECT_FLOAT_EQ(g2.norm_offset(), 1);
  // The family's: embeddings times sqrt(hidden_size) (in the weights' dtype), scores by
  // query_pre_attn_scalar^-1/2.
  EXPECT_EQ(embedding_scale(g2, DType::kF32), std::sqrt(static_cast<float>(g2.hidden_size)));
  ModelConfig wide = g2;
  wide.hidden_size = 3072;  // sqrt: 55.43, which bf16 rounds to 55.5 (steps of 0.25)
  EXPECT_EQ(embedding_scale(wide, DType::kBF16), 55.5f);
  EXPECT_DOUBLE_EQ(g2.attention_scale(), 1 / 16.0);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(g2.window(l), l % 2 == 0 ? 4096 : 0) << l;
  // null: no cap; layer_types listed: as listed.
  const ModelConfig uncapped = gemma2(R"(, "attn_logit_softcapping": null,
      "final_logit_softcapping": null, "sliding_window": 8, "layer_types": ["full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
      "full_attention", "full_attention", "full_attention", "full_attention", "full_attention",
      "sliding_attention"])");
  EXPECT_EQ(uncapped.attn_softcap, 0);
  EXPECT_EQ(uncapped.final_softcap, 0);
  EXPECT_EQ(uncapped.window(0), 0);
  EXPECT_EQ(uncapped.window(11), 8);
  expect_error([&] { gemma2(R"(, "layer_types": ["full_attention"])"); },
               {"g2.json", "layer_types", "1 entries for 12 layers"});
  std::string types;
  for (int l = 0; l < 11; ++l) types += R"("full_attention", )";
  expect_error([&] { gemma2(R"(, "layer_types": [)" + types + R"("chunked_attention"])"); },
               {"g2.json", "layer_types[11]", "sliding_attention"});
  expect_error([&] { gemma2(R"(, "hidden_activation": "relu")"); },
               {"hidden_activation", "relu", "gelu_pytorch_tanh"});
  expect_error([&] { gemma2(R"(, "attn_logit_softcapping": -1)"); },
               {"attn_logit_softcapping", "positive"});
  expect_error([&] { gemma2(R"(, "use_bidirectional_attention": true)"); },
               {"use_bidirectional_attention"});

  const auto gemma3 = [&](const std::string& extra) {
    return parse_model_config(R"({"architectures": ["Gemma3ForCausalLM"], )" + shape + extra + "}",
                              "g3.json");
  };
  const ModelConfig newer = gemma3(R"(, "rope_parameters": {"full_attention": {"rope_type":
      "linear", "factor": 8.0, "rope_theta": 1000000.0}, "sliding_attention": {"rope_type":
      "default", "rope_theta": 10000.0}}, "sliding_window": 1024)");
  const ModelConfig older = gemma3(R"(, "rope_theta": 1000000.0, "rope_scaling": {"rope_type":
      "linear", "factor": 8.0}, "rope_local_base_freq": 10000.0, "sliding_window": 1024,
      "sliding_window_pattern": 6)");
  for (const ModelConfig& c : {newer, older}) {
    EXPECT_EQ(c.attn_softcap, 0);
    EXPECT_EQ(c.final_softcap, 0);
    EXPECT_EQ(c.rope_scaling.type, RopeType::kLinear);
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.rope_local_theta, 1e4);
    for (int l = 0; l < 12; ++l) {
      EXPECT_EQ(c.window(l), (l + 1) % 6 == 0 ? 0 : 1024) << l;
      EXPECT_EQ(c.local_rope(l), (l + 1) % 6 != 0) << l;
    }
  }
  expect_error(
      [&] {
        gemma3(R"(, "rope_parameters": {"full_attention": {"rope_type": "default"},
      "sliding_attention": {"rope_type": "yarn", "factor": 2.0}})");
      },
      {"g3.json", "sliding_attention", "yarn"});
  expect_error([&] { gemma3(R"(, "rope_parameters": {"full_attention": {"rope_type": "ntk"}})"); },
               {"g3.json", "ntk"});

  const ModelConfig p = preset("gemma3-12b");
  const ModelConfig back = parse_model_config(to_config_json(p), "round trip");
  EXPECT_EQ(back.sliding_layers, p.sliding_layers);
  EXPECT_EQ(back.sliding_window, 1024);
  EXPECT_EQ(back.hidden_act, Activation::kGeluTanh);
  EXPECT_FLOAT_EQ(back.query_pre_attn_scalar, 256);
  EXPECT_EQ(back.rope_local_theta, 1e4);
  EXPECT_EQ(describe(back.rope_scaling), describe(p.rope_scaling));
  EXPECT_EQ(back.norm_offset(), 1);
  EXPECT_EQ(parameter_count(p), parameter_count(back));
}

// parameter_count is the weights' element count as the layout lays them out, for every preset
// (Qwen3's and Gemma 3's q/k head norms, Gemma's post norms, biases, tied heads): Llama-3-8B's
// 8.03e9.
TEST(ModelConfig, ParameterCountIsTheLayoutsElements) {
  for (const std::string& name : preset_names()) {
    const ModelConfig c = preset(name);
    const WeightLayout layout(c, DType::kF32);
    std::int64_t elements = 0;
    for (const WeightEntry& e : layout.entries()) elements += e.elements;
    EXPECT_EQ(parameter_count(c), elements) << name;
  }
  EXPECT_EQ(parameter_count(preset("llama3-8b")), 8030261248);
}

// A preset is a config.json text read by the model directory's parser: each written to a file
// loads as a checkpoint's config would, to the same model, and validates; what a family derives
// (Gemma 3's norm offset and its windows' rope base) comes from its config's fields alone.
TEST(ModelConfig, PresetsAreConfigJsonTextsReadByTheSameParser) {
  const std::string dir = ::testing::TempDir() + "kvo_presets";
  std::filesystem::create_directories(dir);
  for (const std::string& name : preset_names()) {
    const std::string text = preset_config_json(name);
    ASSERT_FALSE(text.empty()) << name;
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << text;
    const ModelConfig from_file = load_model_config(path);
    EXPECT_EQ(to_config_json(from_file), to_config_json(preset(name))) << name;
    EXPECT_NO_THROW(validate(from_file)) << name;
  }
  const ModelConfig g = preset("gemma3-12b");
  EXPECT_EQ(g.layers, 48);
  EXPECT_EQ(g.norm_offset(), 1);  // Gemma's (1 + w), its family's, not the preset's
  EXPECT_EQ(g.rope_local_theta, 1e4);
  int full = 0;
  for (int l = 0; l < g.layers; ++l) full += g.window(l) == 0;
  EXPECT_EQ(full, 8);
  EXPECT_EQ(g.window(0), 1024);
  const ModelConfig t = preset("tiny");
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.rope_scaling.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(t.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(preset("qwen3-8b").rms_norm_eps, 1e-6);  // as its config.json says it
  EXPECT_TRUE(preset("qwen2.5-7b").qkv_bias);
  EXPECT_EQ(preset_config_json("no-such-preset"), "");
  expect_error([] { preset("no-such-preset"); },
               {"unknown preset \"no-such-preset\" (known: tiny, llama3-8b"});
}

// Every rope scaling type, read with transformers' defaults and derivations, written back by
// to_config_json unchanged; and what it cannot serve refused by name.
TEST(ModelConfig, RopeScalingsReadAsTransformersReadsThem) {
  const auto config = [](const std::string& rope, const std::string& extra = "") {
    return parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
      "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1,
      "num_attention_heads": 4, "head_dim": 8, "max_position_embeddings": 65536,
      "rope_theta": 10000.0, "rope_scaling": )" +
                                  rope + extra + "}",
                              "cfg.json");
  };
  // yarn: factor given, attention factor derived as 0.1 ln(factor) + 1; betas default.
  const ModelConfig y = config(R"({"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 16384})");
  EXPECT_EQ(y.rope_scaling.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(y.rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1);
  EXPECT_DOUBLE_EQ(y.rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(y.rope_scaling.beta_slow, 1);
  // mscale and mscale_all_dim: their ratio; no factor: max_position over the original.
  const ModelConfig ym = config(R"({"type": "yarn", "mscale": 0.707, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096})");
  EXPECT_DOUBLE_EQ(ym.rope_scaling.factor, 16);
  EXPECT_DOUBLE_EQ(ym.rope_scaling.attention_factor,
                   (0.1 * 0.707 * std::log(16.0) + 1) / (0.1 * std::log(16.0) + 1));
  // longrope: a top-level original_max_position_embeddings wins (Phi-3 keeps it there); the
  // attention factor is sqrt(1 + ln(factor) / ln(original)).
  const std::string factors = "[1, 1, 1, 2]";
  const ModelConfig l =
      config(R"({"rope_type": "longrope", "short_factor": )" + factors + R"(, "long_factor": )" +
                 factors + R"(, "original_max_position_embeddings": 99})",
             R"(, "original_max_position_embeddings": 4096)");
  EXPECT_DOUBLE_EQ(l.rope_scaling.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(l.rope_scaling.factor, 16);
  EXPECT_DOUBLE_EQ(l.rope_scaling.attention_factor,
                   std::sqrt(1 + std::log(16.0) / std::log(4096.0)));
  // llama3 without a pretraining length: max_position_embeddings, as transformers defaults it.
  const ModelConfig l3 = config(R"({"rope_type": "llama3", "factor": 8.0})");
  EXPECT_DOUBLE_EQ(l3.rope_scaling.original_max_position, 65536);
  // Each written by to_config_json and read back the same, table for table.
  for (const ModelConfig& c : {y, ym, l, l3, config(R"({"rope_type": "linear", "factor": 2})"),
                               config(R"({"rope_type": "dynamic", "factor": 2})")}) {
    const ModelConfig back = parse_model_config(to_config_json(c), "round trip");
    EXPECT_EQ(describe(back.rope_scaling), describe(c.rope_scaling));
    for (const std::int64_t len : {1, 4097, 200000}) {
      EXPECT_EQ(rope_table(back, len).inv_freq, rope_table(c, len).inv_freq) << len;
    }
  }
  // rope_scaling wins over rope_parameters where both are given, as in transformers.
  const ModelConfig both = config(R"({"rope_type": "linear", "factor": 2},
    "rope_parameters": {"rope_type": "dynamic", "factor": 3})");
  EXPECT_EQ(both.rope_scaling.type, RopeType::kLinear);
  // Phi-3's class gives 4096 as the pretraining length where config.json has none at the top
  // level, over the block's.
  const ModelConfig phi = parse_model_config(R"({"architectures": ["Phi3ForCausalLM"],
    "vocab_size": 10, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1,
    "num_attention_heads": 4, "head_dim": 8, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "su", "short_factor": [1, 1, 1, 1],
    "long_factor": [1, 2, 3, 4], "original_max_position_embeddings": 16}})",
                                             "phi3.json");
  EXPECT_EQ(phi.rope_scaling.type, RopeType::kLongRope);
  EXPECT_DOUBLE_EQ(phi.rope_scaling.original_max_position, 4096);
  // Qwen3's class defaults head_dim to 128, not hidden / heads.
  const ModelConfig qwen3 = parse_model_config(R"({"architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 10, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1,
    "num_attention_heads": 4})",
                                               "qwen3.json");
  EXPECT_EQ(qwen3.head_dim, 128);
  // Refused, naming what is wrong.
  expect_error([&] { config("null", R"(, "partial_rotary_factor": 0.75)"); },
               {"partial_rotary_factor", "only 1"});
  expect_error([&] { config(R"({"rope_type": "yarn", "factor": 4, "beta_fast": -2})"); },
               {"beta_fast", "positive"});
  // A stretch so large that the base overflows float: frequencies of 0, refused.
  expect_error([&] { config(R"({"rope_type": "dynamic", "factor": 1e30})"); },
               {"dynamic rope", "not positive and finite"});
  expect_error([&] { config(R"({"rope_type": "dynamic", "factor": 0.5})"); },
               {"cfg.json", "factor", "at least 1"});
  expect_error([&] { config(R"({"rope_type": "linear"})"); }, {"factor", "positive"});
  expect_error(
      [&] {
        config(R"({"rope_type": "longrope", "short_factor": [1, 1], "long_factor": [1, 1]})");
      },
      {"short_factor", "has 2 factors; head_dim 8 needs 4"});
  expect_error(
      [&] { config(R"({"rope_type": "yarn", "factor": 4, "partial_rotary_factor": 0.5})"); },
      {"partial_rotary_factor"});
  expect_error([&] { config(R"({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4})"); },
               {"high_freq_factor > low_freq_factor"});
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  expect_error([] { parse_model_config("{\"vocab_size\": 10,", "cfg.json"); },
               {"cfg.json", "line 1, column"});
  expect_error([] { parse_model_config(R"({"architectures": ["GPT2LMHeadModel"]})", "cfg.json"); },
               {"GPT2LMHeadModel", "not supported"});
  expect_error(
      [] {
        parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10})",
                           "cfg.json");
      },
      {"hidden_size: missing (a required field)"});
  expect_error(
      [] {
        parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
          "hidden_size": 64, "intermediate_size": 10, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 3})",
                           "cfg.json");
      },
      {"not a multiple"});
  expect_error(
      [] {
        parse_model_config(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
          "hidden_size": 64, "intermediate_size": 10, "num_hidden_layers": 1,
          "num_attention_heads": 4, "rope_scaling": {"rope_type": "su", "factor": 4}})",
                           "cfg.json");
      },
      {"\"su\" is not supported", "yarn", "longrope"});
  expect_error([] { load_model_config("/nonexistent/config.json"); }, {"cannot open"});
  expect_error([] { preset("llama-9000"); }, {"llama-9000", "tiny"});
}

TEST(Safetensors, ShardedCheckpointLoadsLikeSyntheticWeights) {
  const ModelConfig c = testing::small_config();
  const std::string dir = write_checkpoint("sharded", c, 3, 21);
  const ModelConfig loaded = load_model_config(dir + "/config.json");
  const auto prompt = testing::random_prompt(12, c.vocab_size, 3);
  Decoder from_file(loaded, WeightSource{dir, 0}, testing::host_options(20));
  Decoder drawn(c, WeightSource{"", 21}, testing::host_options(20));
  const auto a = testing::greedy(from_file, prompt, 4);
  const auto b = testing::greedy(drawn, prompt, 4);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(std::memcmp(a.logits[3].data(), b.logits[3].data(), a.logits[3].size() * 4), 0);
}

TEST(Safetensors, LoadsBf16CheckpointsAsBf16OrWidened) {
  ModelConfig c = testing::small_config();
  c.dtype = DType::kBF16;
  const std::string dir = write_checkpoint("bf16", c, 1, 5);
  const auto prompt = testing::random_prompt(9, c.vocab_size, 4);
  // The checkpoint's own dtype: the same bytes as the weights drawn in bf16.
  Decoder from_file(load_model_config(dir + "/config.json"), WeightSource{dir, 0},
                    testing::host_options(20));
  Decoder drawn(c, WeightSource{"", 5}, testing::host_options(20));
  const auto a = testing::greedy(from_file, prompt, 1);
  const auto b = testing::greedy(drawn, prompt, 1);
  EXPECT_EQ(std::memcmp(a.logits[0].data(), b.logits[0].data(), a.logits[0].size() * 4), 0);
  // Widened to f32 (weights exact, K/V no longer rounded): close, not equal.
  DecoderOptions o = testing::host_options(20);
  o.override_dtype = true;
  o.dtype = DType::kF32;
  Decoder widened(load_model_config(dir + "/config.json"), WeightSource{dir, 0}, o);
  const auto w = testing::greedy(widened, prompt, 1);
  const double err =
      testing::relative_error(w.logits[0].data(), b.logits[0].data(), w.logits[0].size());
  EXPECT_GT(err, 0.0);
  // Each within the float32 bound of the double-precision reference of the same bf16 weights
  // (tests/model/reference_forward.hpp): the bf16 run's with its K/V rows rounded to bf16.
  const testing::ReferenceModel reference(c, 5);  // the checkpoint's bf16 values
  const testing::Bounded with_bf16_kv = reference.logits(prompt, {DType::kBF16});
  const testing::Bounded with_f32_kv = reference.logits(prompt);
  const int last = static_cast<int>(prompt.size()) - 1;
  EXPECT_TRUE(testing::check_within(b.logits[0].data(), with_bf16_kv.vr(last),
                                    with_bf16_kv.er(last), with_bf16_kv.sr(last), c.vocab_size)
                  .within());
  EXPECT_TRUE(testing::check_within(w.logits[0].data(), with_f32_kv.vr(last), with_f32_kv.er(last),
                                    with_f32_kv.sr(last), c.vocab_size)
                  .within());
}

// --weights q8_0 and int8 quantize at load: a weight that is not finite (which no scale can hold)
// is refused naming the file, the tensor and the element; the same file loads unquantized.
TEST(Safetensors, WeightsQuantizedAtLoadMustBeFinite) {
  ModelConfig c = testing::small_config();
  c.intermediate_size = 128;  // rows of whole 32-element blocks
  const std::string dir = temp_dir("not_finite");
  write_file(dir + "/config.json", to_config_json(c));
  const WeightLayout layout(c, c.dtype);
  ASSERT_EQ(layout.dtype(), DType::kF32);
  for (const float bad : {NAN, INFINITY}) {
    std::vector<TensorToWrite> tensors;
    for (const auto& e : layout.entries()) {
      TensorToWrite t{e.name, layout.dtype(), e.shape, {}};
      t.data.resize(layout.entry_bytes(e));
      fill_synthetic(layout, e, 3, t.data.data());
      if (e.name == "model.layers.1.mlp.up_proj.weight") std::memcpy(&t.data[4 * 77], &bad, 4);
      tensors.push_back(std::move(t));
    }
    write_safetensors(dir + "/model.safetensors", tensors);
    for (const char* format : {"q8_0", "int8"}) {
      DecoderOptions o = testing::host_options(8);
      o.weight_format = format;
      expect_error(
          [&] {
            Decoder d(c, WeightSource{dir, 0}, o);
          },
          {"model.safetensors", "tensor \"model.layers.1.mlp.up_proj.weight\" element 77",
           std::isnan(bad) ? "is nan" : "is inf", "must be finite"});
    }
    EXPECT_NO_THROW(Decoder(c, WeightSource{dir, 0}, testing::host_options(8)));
  }
}

TEST(Safetensors, MalformedFilesGiveErrorsNamingTheTensor) {
  const ModelConfig c = testing::small_config();
  const std::string dir = write_checkpoint("malformed", c, 1, 1);
  const std::string file = dir + "/model.safetensors";
  const std::string good = read_file(file);
  auto load = [&] { Decoder d(c, WeightSource{dir, 0}, testing::host_options(8)); };

  // Truncated: the last tensor (lm_head) runs past the end of the file.
  write_file(file, good.substr(0, good.size() - 100));
  expect_error(load, {"lm_head.weight", "truncated"});
  write_file(file, good.substr(0, 5));
  expect_error(load, {"truncated"});

  // A header whose length field claims more than the file holds.
  std::string lying_length = good;
  lying_length[5] = '\x7f';
  write_file(file, lying_length);
  expect_error(load, {"header claims"});

  // A header that lies about a tensor's offsets: its range no longer matches its shape.
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  std::string header = good.substr(8, header_len);
  const std::string tensor = "\"model.norm.weight\"";
  const std::size_t at = header.find(tensor);
  ASSERT_NE(at, std::string::npos);
  const std::size_t offsets = header.find("data_offsets\":[", at) + 15;
  const std::size_t comma = header.find(',', offsets);
  std::string begin = header.substr(offsets, comma - offsets);
  std::string moved = std::to_string(std::stoull(begin) + 4);
  moved.resize(begin.size(), ' ');  // keep the header length
  if (moved.size() == begin.size() && moved.find(' ') == std::string::npos) {
    header.replace(offsets, begin.size(), moved);
    write_file(file, good.substr(0, 8) + header + good.substr(8 + header_len));
    expect_error(load, {"model.norm.weight", "data_offsets"});
  }

  // A missing tensor.
  std::vector<TensorToWrite> tensors;
  const WeightLayout layout(c, c.dtype);
  for (const auto& e : layout.entries()) {
    if (e.name == "model.layers.1.mlp.up_proj.weight") continue;
    TensorToWrite t{e.name, layout.dtype(), e.shape, {}};
    t.data.resize(layout.entry_bytes(e));
    tensors.push_back(std::move(t));
  }
  write_safetensors(file, tensors);
  expect_error(load, {"lacks tensor \"model.layers.1.mlp.up_proj.weight\""});

  // A tensor of the wrong shape.
  tensors.push_back({"model.layers.1.mlp.up_proj.weight", DType::kF32, {3, 3}, {}});
  tensors.back().data.resize(36);
  write_safetensors(file, tensors);
  expect_error(load, {"model.layers.1.mlp.up_proj.weight", "[3, 3]", "[144, 64]"});

  // No weights at all.
  std::remove(file.c_str());
  expect_error(load, {"no model.safetensors"});
}

}  // namespace
}  // namespace kvo::model
