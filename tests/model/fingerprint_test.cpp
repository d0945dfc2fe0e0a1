// The model's saved-context fingerprint: every field of the config counts, named; every byte of
// the weights counts, however the checkpoint is sharded; the digest is cached beside the
// checkpoint and recomputed when a file changes; the tokenizer files count; the load options are
// recorded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "kvoffload/fingerprint.hpp"
#include "model/checkpoint/fingerprint.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model_test_util.hpp"

namespace kvo::model {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "kvo_fingerprint_" + name + "_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A tensor of random f32 values.
TensorToWrite random_tensor(const std::string& name, std::vector<std::int64_t> shape,
                            unsigned seed) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  TensorToWrite t{name, DType::kF32, std::move(shape),
                  std::vector<std::byte>(static_cast<std::size_t>(n) * 4)};
  std::mt19937 rng(seed);
  for (std::byte& b : t.data) b = static_cast<std::byte>(rng());
  return t;
}

// Two tensors, the first past one 64 MiB block, so that the blocks are hashed on several threads.
std::vector<TensorToWrite> tensors() {
  return {random_tensor("model.embed_tokens.weight", {4097, 4100}, 1),
          random_tensor("model.norm.weight", {64}, 2)};
}

TEST(Fingerprint, EveryByteOfTheWeightsCountsHoweverTheyAreSharded) {
  const std::string a = temp_dir("a");
  const std::string b = temp_dir("b");
  const std::string sharded = temp_dir("sharded");
  std::vector<TensorToWrite> t = tensors();
  write_safetensors(a + "/model.safetensors", t);
  // The same tensors in two shards and an index: the same weights, the same digest.
  write_safetensors(sharded + "/model-00001-of-00002.safetensors", {t[1]});
  write_safetensors(sharded + "/model-00002-of-00002.safetensors", {t[0]});
  write(sharded + "/model.safetensors.index.json",
        R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
            "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})");
  t[0].data[(64u << 20) + 100] ^= std::byte{1};  // one bit, in the second block
  write_safetensors(b + "/model.safetensors", t);
  const Digest da = weights_digest(a);
  EXPECT_EQ(da.size(), 32u);
  EXPECT_NE(weights_digest(b), da);
  EXPECT_EQ(weights_digest(sharded), da);
  // What the Python drop-in takes of the same tensors loaded: their names, dtypes, shapes and
  // bytes, in any order.
  const std::vector<TensorToWrite> same = tensors();
  WeightsDigest loaded;
  for (auto it = same.rbegin(); it != same.rend(); ++it) {
    loaded.add(it->name, "F32", it->shape, it->data.data(), it->data.size());
  }
  EXPECT_EQ(loaded.hex(), da);
}

TEST(Fingerprint, TheDigestIsCachedBesideTheCheckpointUntilAFileChanges) {
  const std::string dir = temp_dir("cache");
  const std::string path = dir + "/model.safetensors";
  write_safetensors(path, {random_tensor("w", {1024}, 3)});
  const Digest first = weights_digest(dir);
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/kvoffload-fingerprint.json").c_str(), &st), 0);
  // Same size and times, other bytes: the cache answers (it is keyed by size, mtime and inode).
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(st.st_size - 10);
    f.put('x');
  }
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  EXPECT_EQ(weights_digest(dir), first);
  // A new modification time: recomputed from the bytes.
  times[1].tv_sec += 5;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const Digest changed = weights_digest(dir);
  EXPECT_NE(changed, first);
  // A malformed cache, or one of an earlier format (whole files' digests), is no cache.
  write(dir + "/kvoffload-fingerprint.json", "{not json");
  EXPECT_EQ(weights_digest(dir), changed);
  write(dir + "/kvoffload-fingerprint.json",
        R"({"files": [{"name": "model.safetensors", "size": 1, "device": 1, "inode": 1,
            "mtime_ns": 1, "xxh3_128": "0123456789abcdef0123456789abcdef"}]})");
  EXPECT_EQ(weights_digest(dir), changed);
}

TEST(Fingerprint, TheTokenizerFilesCount) {
  const std::string dir = temp_dir("tokenizer");
  EXPECT_EQ(tokenizer_digest(dir), "");  // none: no tokenizer field
  write(dir + "/tokenizer.json", "{}");
  const Digest json = tokenizer_digest(dir);
  write(dir + "/tokenizer_config.json", "{}");
  const Digest both = tokenizer_digest(dir);
  EXPECT_EQ(json.size(), 32u);
  EXPECT_NE(json, both);
  write(dir + "/tokenizer.json", "{ }");
  EXPECT_NE(tokenizer_digest(dir), both);
}

std::string config_text(const ModelConfig& c) {
  Fingerprint f;
  add_config(c, f);
  return f.text();
}

// Each field of ModelConfig, changed alone, changes the fingerprint, and the difference names
// the field as config.json names it. A field added to ModelConfig changes its size: add a case
// for it below, then the size here.
static_assert(sizeof(ModelConfig) == 344,
              "a field was added to ModelConfig: give it a case in "
              "EveryFieldOfTheConfigCountsNamed, then update this size");

TEST(Fingerprint, EveryFieldOfTheConfigCountsNamed) {
  using Change = std::function<void(ModelConfig&)>;
  struct Case {
    const char* key;  // the first field named
    ModelConfig base;
    Change change;
  };
  const ModelConfig llama = testing::small_config();
  ModelConfig llama3 = llama;
  llama3.rope_scaling.type = RopeType::kLlama3;
  llama3.rope_scaling.factor = 8;
  ModelConfig linear = llama;
  linear.rope_scaling.type = RopeType::kLinear;
  linear.rope_scaling.factor = 2;
  ModelConfig yarn = llama;
  yarn.rope_scaling.type = RopeType::kYarn;
  yarn.rope_scaling.factor = 4;
  yarn.rope_scaling.attention_factor = 1.1;
  ModelConfig longrope = llama;
  longrope.rope_scaling.type = RopeType::kLongRope;
  longrope.rope_scaling.factor = 4;
  longrope.rope_scaling.short_factor.assign(8, 1.0);
  longrope.rope_scaling.long_factor.assign(8, 2.0);
  ModelConfig mistral = llama;
  mistral.architecture = "MistralForCausalLM";
  mistral.model_type = "mistral";
  mistral.sliding_window = 32;
  ModelConfig gemma2 = preset("tiny");
  gemma2.architecture = "Gemma2ForCausalLM";
  gemma2.model_type = "gemma2";
  family_of_architecture(gemma2.architecture, "test").settle(gemma2);
  ModelConfig gemma3 = preset("tiny");
  gemma3.architecture = "Gemma3ForCausalLM";
  gemma3.model_type = "gemma3_text";
  family_of_architecture(gemma3.architecture, "test").settle(gemma3);
  ModelConfig granite = preset("tiny");
  granite.architecture = "GraniteForCausalLM";
  granite.model_type = "granite";
  family_of_architecture(granite.architecture, "test").settle(granite);
  const Case cases[] = {
      {"config.model_type", llama,
       [](ModelConfig& c) {
         c.architecture = "Qwen2ForCausalLM";
         c.model_type = "qwen2";
       }},
      {"config.vocab_size", llama, [](ModelConfig& c) { c.vocab_size += 1; }},
      {"config.hidden_size", llama, [](ModelConfig& c) { c.hidden_size *= 2; }},
      {"config.intermediate_size", llama, [](ModelConfig& c) { c.intermediate_size += 1; }},
      {"config.num_hidden_layers", llama, [](ModelConfig& c) { c.layers += 1; }},
      {"config.num_attention_heads", llama, [](ModelConfig& c) { c.heads *= 2; }},
      {"config.num_key_value_heads", llama, [](ModelConfig& c) { c.kv_heads = 1; }},
      {"config.head_dim", llama, [](ModelConfig& c) { c.head_dim = 32; }},
      {"config.rms_norm_eps", llama, [](ModelConfig& c) { c.rms_norm_eps = 1.0000004e-5; }},
      {"config.rope_parameters.rope_theta", llama, [](ModelConfig& c) { c.rope_theta = 1000001; }},
      {"config.max_position_embeddings", llama,
       [](ModelConfig& c) { c.max_position_embeddings = 8; }},
      {"config.tie_word_embeddings", llama, [](ModelConfig& c) { c.tie_word_embeddings = true; }},
      {"config.attention_bias", llama, [](ModelConfig& c) { c.qkv_bias = c.o_bias = true; }},
      {"config.rope_parameters.factor", llama,
       [](ModelConfig& c) {
         c.rope_scaling.type = RopeType::kLinear;
         c.rope_scaling.factor = 4;
       }},
      {"config.rope_parameters.factor", llama3, [](ModelConfig& c) { c.rope_scaling.factor = 4; }},
      {"config.rope_parameters.low_freq_factor", llama3,
       [](ModelConfig& c) { c.rope_scaling.low_freq_factor = 2; }},
      {"config.rope_parameters.high_freq_factor", llama3,
       [](ModelConfig& c) { c.rope_scaling.high_freq_factor = 8; }},
      {"config.rope_parameters.original_max_position_embeddings", llama3,
       [](ModelConfig& c) { c.rope_scaling.original_max_position = 32; }},
      {"config.rope_parameters.rope_type", linear,
       [](ModelConfig& c) { c.rope_scaling.type = RopeType::kDynamic; }},
      {"config.rope_parameters.beta_fast", yarn,
       [](ModelConfig& c) { c.rope_scaling.beta_fast = 16; }},
      {"config.rope_parameters.beta_slow", yarn,
       [](ModelConfig& c) { c.rope_scaling.beta_slow = 2; }},
      {"config.rope_parameters.truncate", yarn,
       [](ModelConfig& c) { c.rope_scaling.truncate = false; }},
      {"config.rope_parameters.attention_factor", yarn,
       [](ModelConfig& c) { c.rope_scaling.attention_factor = 1.2; }},
      {"config.rope_parameters.long_factor", longrope,
       [](ModelConfig& c) { c.rope_scaling.long_factor[3] = 2.5; }},
      {"config.rope_parameters.short_factor", longrope,
       [](ModelConfig& c) { c.rope_scaling.short_factor[0] = 1.5; }},
      {"config.sliding_window", mistral, [](ModelConfig& c) { c.sliding_window = 64; }},
      {"config.layer_types", gemma2, [](ModelConfig& c) { c.sliding_layers[1] ^= 1; }},
      {"config.hidden_activation", gemma2,
       [](ModelConfig& c) { c.hidden_act = Activation::kSilu; }},
      {"config.attn_logit_softcapping", gemma2, [](ModelConfig& c) { c.attn_softcap = 20; }},
      {"config.final_logit_softcapping", gemma2, [](ModelConfig& c) { c.final_softcap = 0; }},
      {"config.query_pre_attn_scalar", gemma2,
       [](ModelConfig& c) { c.query_pre_attn_scalar = 128; }},
      {"config.attention_bias", gemma2, [](ModelConfig& c) { c.qkv_bias = c.o_bias = true; }},
      {"config.embedding_multiplier", granite,
       [](ModelConfig& c) { c.embedding_multiplier = 12.5; }},
      {"config.residual_multiplier", granite, [](ModelConfig& c) { c.residual_multiplier = 0.25; }},
      {"config.attention_multiplier", granite,
       [](ModelConfig& c) { c.attention_multiplier = 0.125; }},
      {"config.logits_scaling", granite, [](ModelConfig& c) { c.logits_scaling = 16; }},
      {"config.rope_parameters.sliding_attention.rope_theta", gemma3,
       [](ModelConfig& c) { c.rope_local_theta = 20000; }},
      {"config.rope_parameters.full_attention.rope_theta", gemma3,
       [](ModelConfig& c) { c.rope_theta = 20000; }},
  };
  for (const Case& t : cases) {
    ModelConfig changed = t.base;
    t.change(changed);
    const std::string difference =
        fingerprint_difference(config_text(t.base), config_text(changed));
    EXPECT_EQ(difference.rfind(std::string(t.key) + " is ", 0), 0u) << t.key << ": " << difference;
  }
  // What config.json cannot say is the family's, and model_type names it (Gemma's norms and
  // scaled embeddings); the checkpoint's dtype is the weights' digest's and load.weights'.
  ModelConfig bf16 = llama;
  bf16.dtype = DType::kBF16;
  EXPECT_EQ(config_text(bf16), config_text(llama));
}

TEST(Fingerprint, TheWholeModelsFieldsAndLoadOptions) {
  const ModelConfig c = testing::small_config();
  const std::string seeded = model_fingerprint(c, "", 7, {"f32", false, false});
  EXPECT_TRUE(is_fingerprint(seeded));
  EXPECT_EQ(fingerprint_field(seeded, "weights.seed"), "7");
  EXPECT_EQ(fingerprint_field(seeded, "load.weights"), "f32");
  EXPECT_EQ(fingerprint_field(seeded, "load.activations"), "f32");
  EXPECT_EQ(fingerprint_field(seeded, "config.rms_norm_eps"), "1e-05");
  EXPECT_EQ(fingerprint_difference(seeded, model_fingerprint(c, "", 8, {"f32", false, false})),
            "weights.seed is 7 in the file and 8 here");
  const std::string q8 = "f32; 9 matrices in GGUF blocks (9 Q8_0)";
  EXPECT_EQ(fingerprint_difference(seeded, model_fingerprint(c, "", 7, {q8, false, false})),
            "load.weights is f32 in the file and " + q8 + " here");
  EXPECT_EQ(fingerprint_difference(model_fingerprint(c, "", 7, {q8, false, false}),
                                   model_fingerprint(c, "", 7, {q8, true, false})),
            "load.weights is " + q8 + " in the file and " + q8 + " (int8: one scale per row) here");
  EXPECT_EQ(fingerprint_difference(model_fingerprint(c, "", 7, {q8, false, false}),
                                   model_fingerprint(c, "", 7, {q8, false, true})),
            "load.activations is f32 in the file and q8 here");
  // A checkpoint: its weights' and tokenizer's digests.
  const std::string dir = temp_dir("whole");
  write_safetensors(dir + "/model.safetensors", {random_tensor("w", {16}, 4)});
  const std::string bare = model_fingerprint(c, dir, 0, {"f32", false, false});
  EXPECT_EQ(fingerprint_field(bare, "weights.xxh3"), weights_digest(dir));
  EXPECT_EQ(fingerprint_field(bare, "tokenizer.xxh3"), "");
  write(dir + "/tokenizer.json", "{}");
  const std::string with = model_fingerprint(c, dir, 0, {"f32", false, false});
  EXPECT_EQ(fingerprint_difference(bare, with).rfind("tokenizer.xxh3 is absent in the file", 0),
            0u);
}

}  // namespace
}  // namespace kvo::model
