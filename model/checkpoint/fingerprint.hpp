// What identifies a model's weights and tokenizer in a saved context's fingerprint, beyond its
// shapes: a digest of every byte of the checkpoint's safetensors files, and of its tokenizer
// files.
//
// Every byte, not the headers and a sample of pages: two fine-tunes of one base share shapes and
// headers, and a fine-tune of a few layers (a merged LoRA) differs in a few tensors only, which a
// sample could miss. The cost is one read of the weights at memory speed (XXH3, 64 MiB blocks on
// every core, about 1 s for 16 GB in the page cache), paid once per file: the digest is cached
// beside the checkpoint, in kvoffload-fingerprint.json, keyed by each file's size, modification
// time, device and inode, and recomputed when any of them changes. Where the model directory
// takes no new files, the cache lives in ${XDG_CACHE_HOME:-~/.cache}/kvoffload/fingerprints/.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace kvo::model {

// A 128-bit XXH3 digest, 32 lowercase hex digits.
using Digest = std::string;

// The digest of the checkpoint's weights: its index (if sharded) and every shard, in the index's
// order. `progress(done, total)` is called with bytes hashed (not called when cached).
// Throws kvo::Error(kInvalidArgument) naming a file that cannot be read.
Digest weights_digest(const std::string& checkpoint_dir,
                      const std::function<void(std::int64_t, std::int64_t)>& progress = {});

// The digest of the tokenizer files (tokenizer.json, tokenizer.model, tokenizer_config.json,
// chat_template.jinja), each absent one counted as absent. Never cached: they are small.
Digest tokenizer_digest(const std::string& model_dir);

// XXH3-128 of every byte of `path` (a regular file), hashed as 64 MiB blocks on several threads
// and then the blocks' digests in order: the same for any thread count.
Digest file_digest(const std::string& path,
                   const std::function<void(std::int64_t, std::int64_t)>& progress = {});

}  // namespace kvo::model
