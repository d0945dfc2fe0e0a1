"""Quantized K/V through the drop-in: OffloadedStaticCache(kv_dtype="int8" or "fp8") stores the
full-attention rows quantized (a scale per token and KV head) and hands the model keys and values
in its own dtype. Against transformers' StaticCache whose rows go through the same quantization,
written here in plain torch from the format's definition (kvoffload/quant.hpp), generate gives the
same logits and tokens: batched, partly resident, eager and compiled with fullgraph=True. The plan holds the
quantized bytes, and bad kv_dtype values are named."""

import unittest

import torch
from transformers import StaticCache

from greedy import MAX_CACHE_LEN, greedy, offloaded
from kvoffload.hf import OffloadedStaticCache
from test_hf_compile import GraphRecorder, compile_config
from tiny_models import make_model, prompts


def through_quantized_rows(states, kv_dtype):
    """states [batch, heads, tokens, dim] as the cache gives them back: per (token, head) scale =
    max|x| / 127 (int8) or / 448 (fp8 e4m3), elements x / scale rounded to nearest even, then
    element * scale in float32, in the states' dtype."""
    x = states.float()
    top = 127.0 if kv_dtype == "int8" else 448.0
    scale = x.abs().amax(-1, keepdim=True) / torch.tensor(top)
    scaled = torch.where(scale > 0, x / scale, torch.zeros_like(x))
    if kv_dtype == "int8":
        codes = scaled.round().clamp(-127, 127)
    else:
        codes = scaled.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return (codes * scale).to(states.dtype)


class QuantizedStaticCache(StaticCache):
    """transformers' StaticCache with every new row quantized and dequantized on the way in."""

    def __init__(self, kv_dtype, **kwargs):
        super().__init__(**kwargs)
        self.kv_dtype = kv_dtype

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(through_quantized_rows(key_states, self.kv_dtype),
                              through_quantized_rows(value_states, self.kv_dtype), layer_idx,
                              *args, **kwargs)


def reference(model, kv_dtype):
    return QuantizedStaticCache(kv_dtype, config=model.config, max_cache_len=MAX_CACHE_LEN)


class QuantizedRows(unittest.TestCase):
    def test_greedy_matches_a_quantizing_static_cache(self):
        for attention in ("sdpa", "eager"):
            model = make_model("llama3", attn_implementation=attention)
            ids, mask = prompts(2, 12, seed=5, pad_rows=(3, 0))
            for kv_dtype in ("int8", "fp8"):
                case = f"{kv_dtype}, {attention}"
                expected = greedy(model, reference(model, kv_dtype), ids, mask)
                cache = offloaded(model, 2, resident_layers=1, kv_dtype=kv_dtype)
                self.assertEqual(cache.kv_dtype, kv_dtype)
                self.assertEqual(greedy(model, cache, ids, mask).tolist(), expected.tolist(),
                                 case)
                cache.reset()
                ids2, mask2 = prompts(2, 7, seed=6, pad_rows=(0, 2))
                self.assertEqual(greedy(model, cache, ids2, mask2).tolist(),
                                 greedy(model, reference(model, kv_dtype), ids2, mask2).tolist(),
                                 f"{case}, after reset()")

    def test_rows_are_the_quantized_rows_bit_for_bit(self):
        # A guard on the token comparisons: at every layer of a prompt and of a decode step, the
        # new rows the cache hands the model are exactly the reference's quantization of the
        # states it was given (no tolerance: the same operations on the same inputs), and not
        # those states themselves.
        model = make_model("llama3")
        ids, mask = prompts(2, 12, seed=5, pad_rows=(3, 0))
        for kv_dtype in ("int8", "fp8"):
            cache = offloaded(model, 2, resident_layers=1, kv_dtype=kv_dtype,
                              static_shapes=False)  # the new rows are the last ones returned
            update = cache.update
            checked = []

            def checking_update(key_states, value_states, layer_idx, *args, **kwargs):
                keys, values = update(key_states, value_states, layer_idx, *args, **kwargs)
                n = key_states.shape[2]
                for given, held in ((key_states, keys), (value_states, values)):
                    rows = held[:, :, -n:]
                    self.assertTrue(torch.equal(rows, through_quantized_rows(given, kv_dtype)),
                                    f"{kv_dtype}, layer {layer_idx}")
                    self.assertFalse(torch.equal(rows, given), f"{kv_dtype}, layer {layer_idx}")
                checked.append(layer_idx)
                return keys, values

            cache.update = checking_update
            with torch.no_grad():
                out = model(ids, attention_mask=mask, cache=cache, use_cache=True)
                step = out.logits[:, -1:].argmax(-1)
                model(step, attention_mask=torch.cat([mask, torch.ones_like(step)], 1),
                      cache=cache, use_cache=True)
            self.assertEqual(len(checked), 2 * model.config.num_hidden_layers, kv_dtype)

    def test_bfloat16_model(self):
        model = make_model("qwen2").to(torch.bfloat16)
        ids, mask = prompts(1, 10, seed=7)
        cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.bfloat16, resident_layers=0,
                                     kv_dtype=torch.int8)
        self.assertEqual(cache.kv_dtype, "int8")
        self.assertEqual(greedy(model, cache, ids, mask).tolist(),
                         greedy(model, reference(model, "int8"), ids, mask).tolist())

    def test_compiled_fullgraph(self):
        torch._dynamo.reset()
        model = make_model("llama3")
        ids, mask = prompts(2, 12, seed=8, pad_rows=(0, 4))
        expected = greedy(model, reference(model, "fp8"), ids, mask)
        recorder = GraphRecorder()
        config = compile_config("eager")
        config.backend = recorder
        cache = offloaded(model, 2, resident_layers=1, kv_dtype="fp8")
        got = greedy(model, cache, ids, mask, compile_config=config)
        self.assertEqual(got.tolist(), expected.tolist())
        self.assertTrue(recorder.graphs, "generate did not compile")
        self.assertEqual(set(recorder.op_counts()), {4})

    def test_plan_holds_the_quantized_bytes(self):
        # llama3 tiny: 2 KV heads of 16: a quantized row is 32 bytes and 2 f32 scales.
        model = make_model("llama3")
        layers = model.config.num_hidden_layers
        for kv_dtype, row in ((None, 2 * 16 * 4), ("int8", 32 + 8), ("fp8", 32 + 8)):
            cache = offloaded(model, 2, resident_layers=0, kv_dtype=kv_dtype)
            plan = cache.plan()
            self.assertEqual(plan["row_bytes"], row, kv_dtype)
            # K and V of every layer: 2 slots x max_cache_len rows, each tensor 256-byte aligned.
            tensor = 2 * MAX_CACHE_LEN * row
            self.assertEqual(plan["tensor_bytes"], (tensor + 255) // 256 * 256, kv_dtype)
            self.assertEqual(plan["host_bytes"], 2 * layers * plan["tensor_bytes"], kv_dtype)

    def test_bad_kv_dtype_is_named(self):
        model = make_model("llama3")
        for bad in ("int4", torch.float64, "fp16x"):
            with self.assertRaises(ValueError) as raised:
                offloaded(model, 1, kv_dtype=bad)
            self.assertIn("kv_dtype is None (the model's dtype, torch.float32), 'fp8'",
                          str(raised.exception))


if __name__ == "__main__":
    unittest.main()
