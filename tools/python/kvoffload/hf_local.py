"""The layers kvoffload.hf keeps on the device itself, in static buffers allocated at construction:
sliding or chunked windows, and fixed-size states (convolution windows, recurrent matrices). They
are small, so they are never offloaded; their bytes are part of the cache's plan.

Each buffer has ``max_batch_size`` rows; a batch of ``rows`` uses the first ``rows`` of them (views,
never copies), as the offloaded layers use the first slots. Nothing here allocates cache storage
after construction: updates write into the buffers in place (the tensors they return may be
temporaries, as transformers' own static layers return).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

from .hf_layers import LayerSpec


def _check_rows(layer: int, what: str, rows: int, capacity: int) -> None:
    if rows > capacity:
        raise ValueError(
            f"layer {layer}: {what} has {rows} rows but the cache was built for max_batch_size="
            f"{capacity}; build it with max_batch_size={rows}"
        )


class WindowLayer(CacheLayerMixin):
    """The last ``window`` tokens of a sliding- or chunked-window attention layer, in static
    buffers keys [batch, kv_heads, window, k_head_dim] and values [batch, kv_heads, window,
    v_head_dim].

    What it returns and the mask sizes it reports follow transformers' StaticSlidingWindowLayer
    (the reference the tests compare with), except while the window is not yet full: then it
    returns only the ``seen + n`` rows written so far (no zero rows to mask out). Once full, the
    buffer holds tokens [seen - window + 1, seen + 1) after a one-token step, and a longer step
    returns the window's last window - 1 rows followed by the new ones.

    With static shapes (``make_static``, the cache's ``static_shapes=True``) it returns the whole
    window while not full, as transformers' StaticSlidingWindowLayer does, and a one-token update
    inside a compiled forward reads no Python int: the count is a 0-d tensor (``seen_tensor``),
    the buffer is rolled once full (a ``where`` on that tensor, no branch) and the new row goes
    at ``min(seen, window - 1)``, so every decode step has one shape and one graph. ``seen`` is
    then set again by the cache from its own length, which it always equals.
    """

    is_sliding = True
    is_compileable = True
    supports_early_init = True  # and initialized at construction: early_initialization skips it

    def __init__(self, spec: LayerSpec, batch: int, device: torch.device, dtype: torch.dtype):
        super().__init__()
        kv = spec.kv
        self.layer_idx = spec.index
        self.window = spec.window
        self.batch_size = batch
        self.device, self.dtype = device, dtype
        self.max_cache_len = spec.window
        self.keys = torch.zeros((batch, kv.kv_heads, spec.window, kv.k_head_dim), dtype=dtype,
                                device=device)
        self.values = torch.zeros((batch, kv.kv_heads, spec.window, kv.v_head_dim), dtype=dtype,
                                  device=device)
        self.is_initialized = True
        self.seen = 0  # tokens this layer has been given since the last reset
        self.rows = 0  # batch rows in use
        self.static_shapes = False
        self.seen_tensor = None

    def make_static(self) -> None:
        """Static shapes from now on (see the class docstring)."""
        self.static_shapes = True
        self.seen_tensor = torch.zeros((), dtype=torch.long, device=self.device)
        torch._dynamo.mark_static_address(self.seen_tensor)

    def set_seen(self, seen: int) -> None:
        self.seen = seen
        if self.seen_tensor is not None:
            self.seen_tensor.fill_(seen)

    def lazy_initialization(self, key_states, value_states) -> None:
        """Nothing to do: the constructor allocated the buffers."""

    def update(self, key_states, value_states, *args, **kwargs):
        rows, n = key_states.shape[0], key_states.shape[2]
        if self.static_shapes and n == 1 and torch.compiler.is_compiling():
            return self._static_decode(key_states, value_states)
        if self.seen == 0:
            _check_rows(self.layer_idx, "key_states", rows, self.batch_size)
            self.rows = rows
        keys, values = self.keys[: self.rows], self.values[: self.rows]
        seen, window = self.seen, self.window
        self.set_seen(seen + n)
        if seen + n <= window:  # still fits: write in place, return the rows written so far
            keys[:, :, seen : seen + n].copy_(key_states)
            values[:, :, seen : seen + n].copy_(value_states)
            if self.static_shapes:  # the whole window: the rows past seen + n are masked
                return keys, values
            return keys[:, :, : seen + n], values[:, :, : seen + n]
        if seen >= window and n == 1:  # full: drop the oldest row, keep the window
            keys.copy_(torch.cat((keys[:, :, 1:], key_states), dim=2))
            values.copy_(torch.cat((values[:, :, 1:], value_states), dim=2))
            return keys, values
        # Several tokens past the window, or becoming full: attend over all of them once, keep
        # the last `window`.
        if seen >= window:
            full_keys = torch.cat((keys[:, :, 1:], key_states), dim=2)
            full_values = torch.cat((values[:, :, 1:], value_states), dim=2)
        elif seen == 0:
            full_keys, full_values = key_states, value_states
        else:
            full_keys = torch.cat((keys[:, :, :seen], key_states), dim=2)
            full_values = torch.cat((values[:, :, :seen], value_states), dim=2)
        keys.copy_(full_keys[:, :, -window:])
        values.copy_(full_values[:, :, -window:])
        return full_keys, full_values

    def _static_decode(self, key_states, value_states):
        """One token, inside a compiled forward with static shapes: no Python int read."""
        keys, values = self.keys[: self.rows], self.values[: self.rows]
        full = self.seen_tensor >= self.window
        at = self.seen_tensor.clamp(max=self.window - 1).view(1)
        for buffer, states in ((keys, key_states), (values, value_states)):
            shifted = torch.where(full, buffer.roll(-1, dims=2), buffer)
            buffer.copy_(shifted.index_copy(2, at, states))
        self.seen_tensor.add_(1)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) of the keys the next update returns."""
        if self.seen >= self.window:
            return self.window - 1 + query_length, self.seen - self.window + 1
        if self.static_shapes and self.seen + query_length <= self.window:
            return self.window, 0
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.window

    def reset(self) -> None:
        self.set_seen(0)
        self.rows = 0

    @property
    def is_croppable(self) -> bool:
        return self.seen <= self.window  # nothing was evicted yet

    def crop(self, tokens_to_remove: int) -> None:
        if not self.is_croppable:
            raise ValueError(
                f"layer {self.layer_idx} keeps only the last {self.window} tokens and has seen "
                f"{self.seen}: the tokens to restore were already dropped"
            )
        self.set_seen(self.seen - tokens_to_remove)

    def buffers(self) -> list[torch.Tensor]:
        return [self.keys, self.values]


class StateLayer(LinearAttentionCacheLayerMixin):
    """A layer's fixed-size states in static buffers [batch, *shape]: a convolution window
    ("conv", kept ``shape[-1]`` tokens wide), a recurrent state ("recurrent"), or MiniMax's
    lightning-attention K^T V ("linear").

    Semantics are those of transformers' LinearAttentionLayer (no past recording): the first
    convolution update after a reset takes the prompt's columns, left-padded with zeros to the
    kernel width, and returns them; later ones return the kept window followed by the new columns
    and keep the last ``kernel`` columns. ``has_previous_state`` is set by the first convolution
    update (or the first linear-cache store), as in transformers; a state is readable (not None)
    only after it. The tensors the get_* calls return are views of the buffers: a model's fused
    decode step may update them in place.
    """

    is_compileable = True
    supports_early_init = False

    def __init__(self, spec: LayerSpec, batch: int, device: torch.device, dtype: torch.dtype):
        self.layer_idx = spec.index
        self.batch_size = batch
        self.device, self.dtype = device, dtype
        self.number_of_states = 1
        self.record_past = False
        self.has_previous_state = {0: False}
        self.state_buffers = {
            state.kind: torch.zeros((batch, *state.shape), dtype=state.resolved_dtype(dtype),
                                    device=device)
            for state in spec.states
        }
        conv = self.state_buffers.get("conv")
        self.conv_kernel_size = {0: conv.shape[-1] if conv is not None else None}
        self.rows = 0

    def __repr__(self):
        return f"{type(self).__name__}(layer={self.layer_idx})"

    # transformers' LinearAttentionCacheLayerMixin reads these dictionaries.
    @property
    def conv_states(self):
        return {0: self.state_buffers.get("conv")}

    @property
    def recurrent_states(self):
        return {0: self.state_buffers.get("recurrent")}

    @property
    def is_conv_states_initialized(self):
        return {0: "conv" in self.state_buffers}

    @property
    def is_recurrent_states_initialized(self):
        return {0: "recurrent" in self.state_buffers}

    def lazy_initialization(self, *args, **kwargs) -> None:
        """Nothing to do: the constructor allocated the buffers."""

    def _buffer(self, kind: str, state_idx: int) -> torch.Tensor:
        buffer = self.state_buffers.get(kind)
        if buffer is None or state_idx != 0:
            raise ValueError(
                f"layer {self.layer_idx}: the model stores a {kind} state #{state_idx}, which "
                "kvoffload did not plan for this layer (its states: "
                f"{', '.join(self.state_buffers)}); the model family's state sizes need updating"
            )
        return buffer

    def _take(self, kind: str, state: torch.Tensor, state_idx: int, leading: int) -> torch.Tensor:
        """The buffer rows a state of `state`'s batch lives in, after checking its shape (all dims
        but the batch, and for a convolution input the trailing time dim)."""
        buffer = self._buffer(kind, state_idx)
        if not self.has_previous_state[0]:
            _check_rows(self.layer_idx, f"the {kind} state", state.shape[0], self.batch_size)
            self.rows = state.shape[0]
        if state.shape[0] != self.rows or state.shape[1:leading] != buffer.shape[1:leading]:
            raise ValueError(
                f"layer {self.layer_idx}: the model's {kind} state has shape {tuple(state.shape)}, "
                f"and kvoffload planned [rows, {', '.join(map(str, buffer.shape[1:]))}] for it "
                f"from the config, with {self.rows or state.shape[0]} rows in use"
            )
        return buffer[: self.rows]

    def update_conv_state(self, conv_states, state_idx: int = 0, conv_kernel_size=None, **kwargs):
        """conv_states [rows, channels, n]: the convolution input of this forward."""
        kept = self._take("conv", conv_states, state_idx, leading=conv_states.dim() - 1)
        kernel = kept.shape[-1]
        if not self.has_previous_state[0]:
            full = conv_states
            if full.shape[-1] < kernel:
                full = torch.nn.functional.pad(full, (kernel - full.shape[-1], 0))
            self.has_previous_state[0] = True
        else:
            full = torch.cat((kept, conv_states), dim=-1)
        kept.copy_(full[..., -kernel:])
        return full

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs):
        """recurrent_states: the state after this forward, [rows, *shape]."""
        kept = self._take("recurrent", recurrent_states, state_idx, leading=recurrent_states.dim())
        kept.copy_(recurrent_states)
        return kept

    def conv_state(self, state_idx: int = 0):
        return self._buffer("conv", state_idx)[: self.rows] if self.has_previous_state[0] else None

    def recurrent_state(self, state_idx: int = 0):
        if not self.has_previous_state[0]:
            return None
        return self._buffer("recurrent", state_idx)[: self.rows]

    def linear_state(self):
        """MiniMax's get_linear_cache: None before the first store."""
        return self.state_buffers["linear"][: self.rows] if self.has_previous_state[0] else None

    def set_linear_state(self, state) -> None:
        kept = self._take("linear", state, 0, leading=state.dim())
        kept.copy_(state)
        self.has_previous_state[0] = True

    def reset(self) -> None:
        for buffer in self.state_buffers.values():
            buffer.zero_()
        self.has_previous_state[0] = False
        self.rows = 0

    @property
    def is_croppable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError(
            f"layer {self.layer_idx} keeps a recurrent or convolution state, which cannot be "
            "rolled back to an earlier token"
        )

    def activate_past_recording(self):
        raise NotImplementedError(
            "kvoffload's state layers keep fixed-size buffers and do not record past states"
        )

    def buffers(self) -> list[torch.Tensor]:
        return list(self.state_buffers.values())


class WindowStateLayer(StateLayer, WindowLayer):
    """A ``hybrid_sliding`` layer: a state and a window of keys and values."""

    is_sliding = True

    def __init__(self, spec, batch, device, dtype):
        WindowLayer.__init__(self, spec, batch, device, dtype)
        StateLayer.__init__(self, spec, batch, device, dtype)

    def reset(self) -> None:
        StateLayer.reset(self)
        WindowLayer.reset(self)

    @property
    def is_croppable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        StateLayer.crop(self, tokens_to_remove)

    def buffers(self) -> list[torch.Tensor]:
        return StateLayer.buffers(self) + WindowLayer.buffers(self)
