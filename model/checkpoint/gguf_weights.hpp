// The decoder's weights read from a GGUF file: each tensor the layout needs found under the name
// llama.cpp gives it, its blocks dequantized (model/checkpoint/ggml_blocks.hpp) and converted to
// the layout's dtype, row by row so no tensor is ever whole in f32.
//
// Names: model.embed_tokens -> token_embd, model.norm -> output_norm, lm_head -> output, and for
// layer N: input_layernorm -> blk.N.attn_norm, self_attn.{q,k,v}_proj -> attn_{q,k,v} (weights and
// biases), o_proj -> attn_output, q_norm/k_norm -> attn_q_norm/attn_k_norm, qkv_proj -> attn_qkv,
// post_attention_layernorm -> ffn_norm, mlp.{gate,up,down}_proj -> ffn_{gate,up,down}, and
// Phi-3's gate_up_proj -> ffn_up (gate's rows first, as in the safetensors tensor).
//
// Llama-architecture files (general.architecture "llama", Mistral's included) store the rows of
// q and k per head in the order of an interleaved rotation: llama.cpp's converter moves row
// half * d/2 + i of each head (d = head_dim) to row 2i + half. The rows are put back where the
// decoder's rotation (the halves of a head rotated together, as transformers does) wants them, as
// transformers' GGUF loader does. Rows move whole; a row's blocks are untouched.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/common/progress.hpp"

namespace kvo::model {

// The GGUF name of the layout's tensor `hf_name` (a name WeightLayout uses). Throws
// kvo::Error(kInvalidArgument) for a name this map does not know.
std::string gguf_tensor_name(const std::string& hf_name);

// Checks, reading no tensor data, that the file holds every tensor the layout needs with its
// shape (GGUF's dimensions reversed) and a type dequantized here, and no layer past the config's.
// Throws kvo::Error(kInvalidArgument) naming the file, the tensor and what differs.
void check_gguf_weights(const WeightLayout& layout, const GgufFile& file);

// The matrices of `layout` (a layout in the model dtype) that WeightLayout keeps in the file's own
// type, by name, with their ggml types: those the file holds in quantized blocks (every type read
// here but F32, F16 and BF16), and with `half` (the host backend) where the layout is f32 those
// in F16 or BF16 as well: the host multiplies them widened in registers, the bits of the
// matrix expanded to f32, from half its bytes. REQUIRES: check_gguf_weights(layout, file) passed.
std::map<std::string, std::uint32_t> gguf_kept_matrices(const WeightLayout& layout,
                                                        const GgufFile& file, bool half);

// Checks as check_gguf_weights does, then uploads every tensor the layout needs: the matrices it
// keeps in the file's type as they are (rows moved, blocks untouched), the others dequantized into
// the layout's dtype, in pieces of at most a few MiB; `progress` (if set) hears
// (tensors done, tensors) after each one.
void load_gguf_weights(const WeightLayout& layout, const GgufFile& file, const UploadFn& upload,
                       const ProgressFn& progress = {});

}  // namespace kvo::model
