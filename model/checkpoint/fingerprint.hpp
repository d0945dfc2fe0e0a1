// The model's saved-context fingerprint (the format: include/kvoffload/fingerprint.hpp), as
// kvo-generate writes it: the config as its family writes it, the weights' and the tokenizer's
// digests, and the load options that change the keys.
//
// The weights' digest covers every byte of every tensor, not the headers and a sample of pages:
// two fine-tunes of one base share shapes and headers, and a fine-tune of a few layers (a merged
// LoRA) differs in a few tensors only, which a sample could miss. It is the digest the Python
// drop-in takes of the same tensors loaded by transformers (WeightsDigest: names, dtypes, shapes
// and bytes, whatever files held them), so that a context moves between the two. The cost is one
// read of the weights at memory speed (XXH3, 64 MiB blocks on every core, about 1 s for 16 GB in
// the page cache), paid once per file: each file's tensor digests are cached beside the
// checkpoint, in kvoffload-fingerprint.json, keyed by the file's size, modification time, device
// and inode, and recomputed when any of them changes. Where the model directory takes no new
// files, the cache lives in ${XDG_CACHE_HOME:-~/.cache}/kvoffload/fingerprints/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvoffload/fingerprint.hpp"
#include "model/checkpoint/model_config.hpp"

namespace kvo::model {

// A 128-bit XXH3 digest, 32 lowercase hex digits.
using Digest = std::string;

// The digest of a safetensors checkpoint's weights (WeightsDigest over every tensor of its
// shards). `progress(done, total)` is called with bytes hashed (not called when cached).
// Throws kvo::Error(kInvalidArgument) naming a file that cannot be read or is malformed.
Digest weights_digest(const std::string& checkpoint_dir,
                      const std::function<void(std::int64_t, std::int64_t)>& progress = {});

// The digest of the tokenizer files beside a checkpoint (files_digest of kTokenizerFiles); ""
// where there are none. Never cached: they are small.
Digest tokenizer_digest(const std::string& model_dir);

// The digest of every byte of `path` (a regular file: a GGUF file, whose tokenizer is inside),
// as WeightsDigest::bytes_digest gives it.
Digest file_digest(const std::string& path,
                   const std::function<void(std::int64_t, std::int64_t)>& progress = {});

// The config's fields under "config.": the config.json its family writes (to_config_json), less
// architectures and the checkpoint's dtype (the weights' digest and load.weights hold those) and
// a top-level original_max_position_embeddings (Phi-3's: the rope block states the pretraining
// length the rope reads), flattened ("config.rope_parameters.rope_theta"). Left out, so that a
// writer need not state what is off: top-level fields that are false, null or empty, layer_types
// when every layer attends in full, and null fields inside a block. Lists are written "[a,b]",
// numbers as fingerprint_number writes them.
void add_config(const ModelConfig& config, Fingerprint& fingerprint);

// How the weights were loaded, as far as it changes the keys.
struct LoadedWeights {
  // The format the matrices multiply in: the model dtype ("bf16"), or that and the GGUF blocks
  // kept ("f32; 211 matrices in GGUF blocks (210 Q4_1, 1 Q8_0)"); Decoder::weights_text(false),
  // which leaves out f16/bf16 matrices kept in an f32 model (they give the expanded load's bits).
  std::string format;
  bool per_row_scales = false;  // --weights int8: Q8_0 blocks sharing a scale per row
  bool q8_activations = false;  // the blocks multiply activations quantized to 8 bits
};

// The whole fingerprint of a model: its config; the weights' digest (a safetensors checkpoint),
// the file's (a GGUF file, tokenizer inside) or the seed they were drawn from (`checkpoint`
// empty); the tokenizer's digest where the checkpoint has tokenizer files; the load options.
std::string model_fingerprint(const ModelConfig& config, const std::string& checkpoint,
                              std::uint64_t seed, const LoadedWeights& loaded,
                              const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace kvo::model
