"""The model fingerprint a saved context of the drop-in carries (the format is the library's,
kvoffload/fingerprint.hpp): the model's config as transformers states it, a digest of its weights
as loaded, its tokenizer's files where one is given, and how it was loaded. kvo-generate states
the same facts of the same model in the same bytes (model/checkpoint/fingerprint.hpp), so that a
context moves between the two, and a load under any difference is refused naming the field.

- **config.** Every field of the decoder's config (``config.get_text_config(decoder=True)``,
  ``to_dict()``), flattened (``config.rope_parameters.rope_theta``), but for the fields that never
  change a key (``_NOT_KEYS``: bookkeeping, token ids, dropout and initialisation, which run only
  in training, and the fields transformers folds into others) and, as the library's writer does,
  top-level fields that are off (false, null or empty), ``layer_types`` where every layer attends
  in full, and null fields inside a block. ``head_dim`` is the keys' where the config gives none. Numbers
  are written by the library (``fingerprint_number``), so ``500000`` and ``500000.0`` are one
  value and ``1e-05`` and ``1.0000004e-05`` two.
- **weights.xxh3.** The library's WeightsDigest over the model's state dict as loaded (each
  tensor's name, dtype, shape and bytes; a tensor tied to another counted once, under its first
  name), computed once per model and again when a parameter changed in place; under tensor
  parallelism the whole model's, each rank's shards gathered.
- **tokenizer.xxh3.** With ``tokenizer=`` (its directory, or a tokenizer loaded from one), the
  digest of its files, as kvo-generate takes it of a checkpoint's.
- **load.weights, load.activations.** The weights' dtype (or the quantization they were loaded
  with, and its config) and the dtype the model computes in.
- **tp.world_size, tp.rank.** A tensor-parallel rank's file (kvoffload/hf_tp.py).
"""

from __future__ import annotations

import json
import os

import torch

from . import _native, hf_tp

# Fields of a transformers config that never change a key or a value: bookkeeping, generation,
# training-only settings, and what transformers folds into other fields (which are recorded).
_NOT_KEYS = frozenset({
    "transformers_version", "architectures", "output_hidden_states", "output_attentions",
    "return_dict", "dtype", "torch_dtype", "chunk_size_feed_forward", "is_encoder_decoder",
    "id2label", "label2id", "problem_type", "initializer_range", "initializer_factor",
    "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id",
    "decoder_start_token_id", "tokenizer_class", "pretraining_tp", "quantization_config",
    "torchscript", "tie_encoder_decoder", "prefix", "task_specific_params", "finetuning_task",
    "add_cross_attention", "cross_attention_hidden_size", "tf_legacy_loss", "use_bfloat16",
    "pruned_heads", "base_model_tp_plan", "base_model_pp_plan", "distributed_config",
    # folded into layer_types and sliding_window (Qwen2, Qwen3, Gemma 3)
    "use_sliding_window", "max_window_layers", "sliding_window_pattern",
})

# Rope types that read the pretraining length (original_max_position_embeddings).
_PRETRAINING_LENGTH_ROPES = frozenset({"llama3", "yarn", "longrope"})

# torch dtype -> safetensors' name of it (the names kvo-generate's checkpoints give).
_TENSOR_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
# torch dtype -> the library's name (kvoffload/types.hpp), as kvo-generate names its weights.
_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# A tensor on a device is hashed through a host buffer of this many bytes.
_PIECE_BYTES = 64 << 20


def _not_a_key(name: str) -> bool:
    return (name in _NOT_KEYS or name.startswith("_") or "dropout" in name
            or name.endswith("pdrop"))


def _rope_block(block: dict, pretraining_length) -> dict:
    """One rope block as the library's writer states it: ``rope_type`` alone (not its older
    alias ``type``), no ``partial_rotary_factor`` of 1 (every dimension rotated), and the
    top-level pretraining length, which transformers and the native reader take over the
    block's, inside the block of the types that read it."""
    block = dict(block)
    if "rope_type" in block:
        block.pop("type", None)
    if block.get("partial_rotary_factor") == 1:
        del block["partial_rotary_factor"]
    if pretraining_length is not None and block.get("rope_type") in _PRETRAINING_LENGTH_ROPES:
        block["original_max_position_embeddings"] = pretraining_length
    return block


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _native.fingerprint_number(value)
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _flatten(fields: dict, prefix: str, top: bool, out: dict) -> None:
    for name, value in fields.items():
        key = prefix + str(name)
        if value is None:
            continue
        if top and (value is False or (isinstance(value, (list, tuple, dict)) and not value)):
            continue
        if top and name == "layer_types" and all(t == "full_attention" for t in value):
            continue
        if isinstance(value, dict):
            _flatten(value, key + ".", False, out)
        else:
            out[key] = _value(value)


def config_fields(text_config, head_dim: int | None) -> dict[str, str]:
    """The ``config.*`` fields of a decoder's config (see the module's docstring)."""
    d = text_config.to_dict()
    pretraining_length = d.pop("original_max_position_embeddings", None)
    rope = d.get("rope_parameters")
    if isinstance(rope, dict):
        d.pop("rope_theta", None)  # inside rope_parameters, as transformers 5 keeps it
        d.pop("rope_scaling", None)
        if rope and all(isinstance(v, dict) for v in rope.values()):  # by layer type (Gemma 3)
            d["rope_parameters"] = {kind: _rope_block(block, pretraining_length)
                                    for kind, block in rope.items()}
        else:
            d["rope_parameters"] = _rope_block(rope, pretraining_length)
    elif pretraining_length is not None:
        d["original_max_position_embeddings"] = pretraining_length
    d = {name: value for name, value in d.items() if not _not_a_key(name)}
    if d.get("head_dim") is None and head_dim is not None:  # Qwen2, Phi-3: hidden / heads
        d["head_dim"] = head_dim
    out: dict[str, str] = {}
    _flatten(d, "config.", True, out)
    return out


def _tensor_bytes_digest(tensor: torch.Tensor) -> str:
    tensor = tensor.detach().contiguous()
    if tensor.device.type == "cpu":
        return _native.bytes_digest(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    flat = tensor.reshape(-1).view(torch.uint8)
    digest = _native.TensorBytes()
    piece = torch.empty(min(_PIECE_BYTES, flat.numel()), dtype=torch.uint8,
                        pin_memory=torch.cuda.is_available())
    for begin in range(0, flat.numel(), _PIECE_BYTES):
        part = flat[begin:begin + _PIECE_BYTES]
        piece[:part.numel()].copy_(part)
        digest.update(piece.data_ptr(), part.numel())
    return digest.digest()


def _state(model) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """The model's state as loaded, as (name, tensor, this rank's part of it: the tensor itself
    but for a tensor-parallel DTensor), a tensor shared by several names (tied embeddings) once,
    under the first name."""
    out, seen = [], set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.Tensor):
            continue
        if tensor.device.type == "meta":
            raise ValueError(
                f"{name} is on the meta device (its weights were never loaded, or are offloaded "
                "by accelerate): a saved context records a digest of every weight, so the model "
                "must hold them")
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        identity = (local.untyped_storage().data_ptr(), local.storage_offset(),
                    tuple(local.shape), local.dtype)
        if local.numel() and identity in seen:
            continue
        seen.add(identity)
        out.append((name, tensor, local))
    return out


def weights_digest(model, shard=None, device=None) -> str:
    """The library's WeightsDigest of the model's state dict as loaded; computed once per model
    (kept on it) and again when a tensor changed in place or was replaced. Under tensor
    parallelism (``shard``, kvoffload/hf_tp.py) it is the whole model's, the same on every rank
    and for any world size: each sharded tensor is gathered whole (every rank takes part, one
    tensor at a time), and the ranks agree first whether any must take it again."""
    state = _state(model)
    key = tuple((name, t.data_ptr(), t._version, t.dtype, tuple(t.shape))
                for name, _, t in state)
    kept = getattr(model, "_kvoffload_weights_digest", None)
    stale = kept is None or kept[0] != key
    if shard is not None and shard.parallel:
        stale = hf_tp.agree_range(shard, device or torch.device("cpu"), [int(stale)])[1][0] == 1
    if not stale:
        return kept[1]
    tensors = []
    for name, tensor, local in state:
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else local
        dtype = _TENSOR_DTYPES.get(whole.dtype, str(whole.dtype).replace("torch.", ""))
        tensors.append((name, dtype, list(whole.shape), _tensor_bytes_digest(whole)))
    digest = _native.weights_digest(tensors)
    model._kvoffload_weights_digest = (key, digest)
    return digest


def tokenizer_digest(tokenizer) -> str:
    """The digest of a tokenizer's files: ``tokenizer`` is their directory, or a tokenizer loaded
    from one (its ``name_or_path``)."""
    directory = tokenizer if isinstance(tokenizer, (str, os.PathLike)) else getattr(
        tokenizer, "name_or_path", None)
    if directory is None or not os.path.isdir(directory):
        raise ValueError(
            "tokenizer must be the directory of the tokenizer's files, or a tokenizer loaded "
            f"from one (its name_or_path), got {tokenizer!r}")
    digest = _native.tokenizer_digest(os.fspath(directory))
    if not digest:
        raise ValueError(f"{directory} holds no tokenizer files (tokenizer.json, "
                         "tokenizer.model, tokenizer_config.json, chat_template.jinja)")
    return digest


def load_fields(model) -> dict[str, str]:
    """How the model was loaded, as far as it changes the keys."""
    quantization = getattr(model.config, "quantization_config", None)
    if quantization is not None:
        settings = quantization.to_dict() if hasattr(quantization, "to_dict") else quantization
        weights = "quantized " + json.dumps(settings, sort_keys=True, default=str)
    else:
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        weights = "+".join(sorted(_DTYPE_NAMES.get(t, str(t).replace("torch.", ""))
                                  for t in dtypes))
    dtype = getattr(model, "dtype", None)
    return {"load.weights": weights,
            "load.activations": _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))}


def check_model(model, what: str):
    """``model`` as the transformers model a saved context's fingerprint is taken of."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config") or not hasattr(
            model.config, "get_text_config"):
        raise TypeError(
            f"{what} needs the model (a transformers PreTrainedModel): a saved context records "
            f"a digest of its weights, which its config alone does not give; got "
            f"{type(model).__name__}")
    return model


def model_fingerprint(model, head_dim: int | None, shard, tokenizer=None, device=None) -> str:
    """The whole fingerprint (see the module's docstring) of ``model``, for a cache of this
    ``shard`` (kvoffload/hf_tp.py) on ``device``. Under tensor parallelism every rank calls it
    (the weights' digest gathers sharded tensors)."""
    fields = config_fields(model.config.get_text_config(decoder=True), head_dim)
    fields["weights.xxh3"] = weights_digest(model, shard, device)
    if tokenizer is not None:
        fields["tokenizer.xxh3"] = tokenizer_digest(tokenizer)
    fields.update(load_fields(model))
    if shard.sharded:
        fields["tp.world_size"] = str(shard.world_size)
        fields["tp.rank"] = str(shard.rank)
    return _native.fingerprint(fields)
