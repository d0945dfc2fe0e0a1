"""What each decoder layer of a transformers model keeps, read from its config alone, and where
kvoffload.hf keeps it.

Every layer is one of (transformers' names from ``get_layer_types_and_kwargs``):

- ``full_attention`` (and a sliding or chunked window at least ``max_cache_len`` long, which never
  hides a token the cache holds): every token's keys and values. **Offloaded**: kept by the native
  runtime, resident or streamed through its staging ring.
- ``sliding_attention`` / ``chunked_attention`` with a shorter window: the last ``window`` tokens.
  **Window**: a static device buffer of ``window`` rows per batch row, allocated at construction.
- ``linear_attention`` / ``conv``: a fixed-size state per batch row (a convolution window, a
  recurrent matrix). **State**: static device buffers whose sizes come from the model family's
  config fields (``_STATE_SHAPES``), allocated at construction.
- ``hybrid`` / ``hybrid_sliding``: a state and full-attention (or windowed) keys and values.
- ``dummy`` from an attention-free layer (``moe``, ``mlp``): nothing.

Keys and values are described separately (``kv_heads``, ``k_head_dim``, ``v_head_dim``) because
they need not have the same head size: transformers caches multi-head latent attention (DeepSeek
V2/V3) as one "head" whose key is the compressed latent (``kv_lora_rank`` wide) and whose value is
the rope key (``qk_rope_head_dim`` wide). Window layers hold such rows as they are, and the
native runtime stores keys and values of their own head sizes (CacheConfig.v_head_dim).

Everything refused is named with its layer and why, all at once (UnsupportedModelError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers.cache_utils import get_layer_types_and_kwargs

# Where a layer's keys and values live.
OFFLOADED = "offloaded"  # the native runtime: resident or streamed
WINDOW = "window"  # a static device buffer of the window's rows


class UnsupportedModelError(ValueError):
    """The model has layers this cache cannot serve; the message names them and says why."""


@dataclass(frozen=True)
class KvLayout:
    """One layer's per-token rows: [kv_heads, k_head_dim] keys and [kv_heads, v_head_dim] values."""

    kv_heads: int
    k_head_dim: int
    v_head_dim: int

    def row_elements(self) -> int:
        """Elements of one token's key row plus its value row."""
        return self.kv_heads * (self.k_head_dim + self.v_head_dim)


@dataclass(frozen=True)
class StateSpec:
    """One fixed-size state of a layer, per batch row: ``shape`` in ``dtype`` (None: the cache's
    dtype, i.e. the model's). ``kind`` is how the model reaches it: "conv" and "recurrent"
    (Cache.update_conv_state / update_recurrent_state) or "linear" (MiniMax's get/set_linear_cache).
    """

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None

    def resolved_dtype(self, cache_dtype: torch.dtype) -> torch.dtype:
        return self.dtype or cache_dtype


@dataclass(frozen=True)
class LayerSpec:
    """What layer ``index`` keeps and where: ``attention`` is OFFLOADED, WINDOW or None (no keys
    and values); ``window`` the rows a WINDOW layer keeps; ``states`` its fixed-size states."""

    index: int
    layer_type: str
    attention: str | None
    kv: KvLayout | None
    window: int | None
    states: tuple[StateSpec, ...]

    def window_bytes(self, batch: int, element_size: int) -> int:
        if self.attention != WINDOW:
            return 0
        return batch * self.window * self.kv.row_elements() * element_size

    def state_bytes(self, batch: int, cache_dtype: torch.dtype) -> int:
        total = 0
        for state in self.states:
            size = torch.empty((), dtype=state.resolved_dtype(cache_dtype)).element_size()
            total += batch * math.prod(state.shape) * size
        return total


def _text_attr(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def kv_layout(layer_config) -> KvLayout:
    """The rows one attention layer passes to ``Cache.update``, from its config:

    - multi-head latent attention (``kv_lora_rank``): one head, keys kv_lora_rank wide (the
      compressed latent), values qk_rope_head_dim wide (the rope key);
    - Falcon-style layouts: with ``new_decoder_architecture`` (Falcon-40B/180B) transformers
      broadcasts each of the ``num_kv_heads`` groups to every attention head before caching, so
      the cache holds ``num_attention_heads`` rows per token; otherwise ``multi_query`` (Falcon-7B,
      GPT-BigCode) means a single KV head while ``num_kv_heads`` still reports the head count;
    - else ``num_key_value_heads`` (or ``num_kv_heads``), default the attention head count, and
      ``head_dim`` (default hidden_size // heads) for keys and values alike, unless ``v_head_dim``
      says otherwise.
    """
    heads = int(_text_attr(layer_config, "num_attention_heads", "n_head"))
    head_dim = _text_attr(layer_config, "head_dim") or layer_config.hidden_size // heads
    lora_rank = getattr(layer_config, "kv_lora_rank", None)
    if lora_rank:
        return KvLayout(1, int(lora_rank), int(layer_config.qk_rope_head_dim))
    if getattr(layer_config, "new_decoder_architecture", False):
        kv_heads = heads
    elif getattr(layer_config, "multi_query", False):
        kv_heads = 1
    else:
        kv_heads = _text_attr(layer_config, "num_key_value_heads", "num_kv_heads", default=heads)
    v_head_dim = getattr(layer_config, "v_head_dim", None) or head_dim
    return KvLayout(int(kv_heads), int(head_dim), int(v_head_dim))


# ---- fixed-size states, per model family ----------------------------------------------------
#
# transformers allocates these lazily, at the first update; kvoffload allocates them at
# construction, so it must know their shapes from the config. Each entry is checked by the tests
# against what the model itself stores (tests/python/test_hf_layouts.py). Shapes are per batch row.


def _gated_delta_net(c, layer_type):  # Qwen3-Next's linear attention
    key_dim = c.linear_num_key_heads * c.linear_key_head_dim
    value_dim = c.linear_num_value_heads * c.linear_value_head_dim
    return (
        StateSpec("conv", (2 * key_dim + value_dim, c.linear_conv_kernel_dim)),
        StateSpec(
            "recurrent",
            (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim),
            torch.float32,  # the delta rule runs and returns its state in float32
        ),
    )


def _mamba(c, layer_type):  # Jamba's Mamba-1 mixer
    inner = c.mamba_expand * c.hidden_size
    return (
        StateSpec("conv", (inner, c.mamba_d_conv)),
        StateSpec("recurrent", (inner, c.mamba_d_state), torch.float32),
    )


def _mamba2(inner):  # Bamba's and Falcon-H1's Mamba-2 mixers, given their inner width
    def states(c, layer_type):
        conv = inner(c) + 2 * c.mamba_n_groups * c.mamba_d_state
        return (
            StateSpec("conv", (conv, c.mamba_d_conv)),
            StateSpec(
                "recurrent", (c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state), torch.float32
            ),
        )

    return states


def _short_conv(c, layer_type):  # LFM2's gated short convolution
    return (StateSpec("conv", (c.hidden_size, c.conv_L_cache)),)


def _lightning(c, layer_type):  # MiniMax's lightning attention: K^T V per head
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return (StateSpec("linear", (c.num_attention_heads, head_dim, head_dim)),)


_STATE_SHAPES = {
    "qwen3_next": _gated_delta_net,
    "jamba": _mamba,
    "bamba": _mamba2(lambda c: int(c.mamba_expand * c.hidden_size)),
    "falcon_h1": _mamba2(lambda c: c.mamba_d_ssm or int(c.mamba_expand * c.hidden_size)),
    "lfm2": _short_conv,
    "minimax": _lightning,
}

_STATE_LAYER_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding")
_WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention", "hybrid_sliding")
_REFUSED_LAYER_TYPES = {
    "indexed_attention": "it keeps an indexer key cache besides its keys and values",
}


def _per_layer_configs(text_config) -> list:
    layers = int(text_config.num_hidden_layers)
    per_layer = getattr(text_config, "per_layer_config", None)
    if per_layer is not None and len(per_layer) == layers:
        return list(per_layer)
    return [text_config] * layers


def _shares_kv(text_config, index: int) -> bool:
    modes = getattr(text_config, "kv_sharing_modes", None)
    return modes is not None and modes[index] == "reuse"


# The most layers a config may claim: far more than any model has (Llama 3.1 405B: 126).
MAX_LAYERS = 1 << 16


def describe_layers(text_config, max_cache_len: int) -> list[LayerSpec]:
    """One LayerSpec per decoder layer, or UnsupportedModelError naming every layer the cache
    cannot serve and why."""
    if getattr(text_config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            "kvoffload's OffloadedStaticCache serves decoder-only models: an encoder-decoder model "
            "also needs a cross-attention cache (transformers' EncoderDecoderCache)"
        )
    layers = getattr(text_config, "num_hidden_layers", None)
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)
                               or not 1 <= layers <= MAX_LAYERS):
        # Refused before anything is built for each layer (a claim of 2^31 would loop that long).
        raise ValueError(f"the config's num_hidden_layers must be an int from 1 to {MAX_LAYERS}, "
                         f"got {layers!r}")
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text_config)
    configs = _per_layer_configs(text_config)
    model = getattr(text_config, "model_type", None) or type(text_config).__name__
    specs, problems = [], []
    for index, (layer_type, kwargs, config) in enumerate(zip(layer_types, layer_kwargs, configs)):
        where = f"layer {index} ({layer_type})"
        if layer_type == "dummy":
            if _shares_kv(text_config, index):
                problems.append(
                    f"{where}: it attends over keys and values another layer stored (shared KV), "
                    "and a streamed layer's rows are valid during its own attention only"
                )
            else:  # attention-free: nothing to keep
                specs.append(LayerSpec(index, layer_type, None, None, None, ()))
            continue
        if layer_type in _REFUSED_LAYER_TYPES:
            problems.append(f"{where}: {_REFUSED_LAYER_TYPES[layer_type]}")
            continue
        known = ("full_attention", "sliding_attention", "chunked_attention") + _STATE_LAYER_TYPES
        if layer_type not in known:
            problems.append(f"{where}: kvoffload does not know this layer type")
            continue

        states = ()
        if layer_type in _STATE_LAYER_TYPES:
            shapes = _STATE_SHAPES.get(model)
            if shapes is None:
                problems.append(
                    f"{where}: kvoffload allocates fixed-size states at construction and does not "
                    f"know the sizes of {model}'s states (known: {', '.join(sorted(_STATE_SHAPES))})"
                )
                continue
            if int(kwargs.get("number_of_states", 1)) != 1:
                problems.append(f"{where}: it keeps {kwargs['number_of_states']} states; one is served")
                continue
            states = shapes(config, layer_type)

        attention, window, kv = None, None, None
        if layer_type not in ("linear_attention", "conv"):
            kv = kv_layout(config)
            attention = OFFLOADED
            if layer_type in _WINDOWED_LAYER_TYPES:
                window = kwargs.get("sliding_window")
                # A window at least max_cache_len long never hides a token the cache can hold: the
                # layer attends exactly as a full-attention layer does.
                if window is not None and int(window) < max_cache_len:
                    attention, window = WINDOW, int(window)
                else:
                    window = None
        specs.append(LayerSpec(index, layer_type, attention, kv, window, states))

    offloaded = [s for s in specs if s.attention == OFFLOADED]
    for spec in offloaded:
        if spec.kv != offloaded[0].kv:
            problems.append(
                f"layer {spec.index}: its rows ({_describe(spec.kv)}) differ from layer "
                f"{offloaded[0].index}'s ({_describe(offloaded[0].kv)}); the offloaded layers "
                "share one row size"
            )
    if not problems and not any(s.attention for s in specs):
        problems.append("no layer keeps keys and values: transformers' own caches fit this model")
    if problems:
        raise UnsupportedModelError(
            f"kvoffload's OffloadedStaticCache cannot serve {len(problems)} layer(s) of this "
            f"{model} model:\n  " + "\n  ".join(problems)
        )
    return specs


def _describe(kv: KvLayout) -> str:
    return f"kv_heads={kv.kv_heads}, head_dim={kv.k_head_dim}" + (
        f"/{kv.v_head_dim}" if kv.v_head_dim != kv.k_head_dim else ""
    )
