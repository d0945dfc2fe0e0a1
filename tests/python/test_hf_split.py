"""Split attention in the drop-in (kvoffload/hf_split.py): OffloadedStaticCache(split=...) on the
CPU (the host backend), every full-attention layer streamed through a ring of one buffer.

- Greedy tokens equal transformers' StaticCache's for a Llama, a Qwen2 of GQA group 7, a Gemma 2
  (its sliding layers kept as windows, never split) and a GPT-OSS (attention sinks), at split
  points 0, 1, a middle row and past the whole prefix; one row (sdpa, Gemma 2 eager) and two
  left-padded rows (eager, additive masks; the padding inside the host rows).
- The bytes: a split run moves over the bus exactly what the same run unsplit moves, less
  ``split_bytes_saved``, which is the formula's: every streamed layer of every decode step keeps
  min(split, length) rows of K and V per batch row on the host.
- Quantized K/V (int8, fp8): a split run gives the unsplit run's tokens.
- The host part matters: with its output zeroed the tokens change.
- It cannot be half on: a model whose attention was set back after the cache was built is refused
  at the next layer; bad ``split`` values are refused.
- Compiled: torch.compile(fullgraph=True) of the decode forward, the host part the opaque op
  kvoffload::attend, gives the same tokens.
"""

import ctypes
import unittest

import torch

from greedy import MAX_CACHE_LEN, NEW_TOKENS, greedy, reference_cache
from kvoffload import _native
from kvoffload.hf import OffloadedStaticCache
from kvoffload.hf_layers import OFFLOADED, describe_layers
from test_hf_compile import GraphRecorder, compile_config
from tiny_models import make_model, prompts

# name -> (attention for one row, config overrides)
MODELS = {
    "llama3": ("sdpa", {}),
    "qwen2": ("sdpa", dict(num_attention_heads=7, num_key_value_heads=1, hidden_size=112)),
    "gemma2": ("eager", {}),  # soft caps: eager only
    "gpt_oss": ("eager", {}),  # attention sinks, windows on every other layer
}
PROMPT = 20
SPLITS = (0, 1, PROMPT // 2, MAX_CACHE_LEN)  # the last: the whole committed prefix


def split_cache(model, batch, split):
    return OffloadedStaticCache(model.config, batch, MAX_CACHE_LEN, device="cpu",
                                dtype=torch.float32, resident_layers=0, ring_depth=1,
                                split=split)


def model_of(name, attention=None):
    default, overrides = MODELS[name]
    return make_model(name, attn_implementation=attention or default, **overrides)


class SplitTokens(unittest.TestCase):
    def test_greedy_tokens_equal_static_cache_at_every_split(self):
        for name in MODELS:
            for batch, attention, pads in ((1, None, ()), (2, "eager", (3, 0))):
                model = model_of(name, attention)
                implementation = model.config._attn_implementation
                ids, mask = prompts(batch, PROMPT, seed=4, pad_rows=pads)
                expected = greedy(model, reference_cache(model), ids, mask).tolist()
                for split in SPLITS:
                    case = f"{name}, {batch} row(s), {implementation}, split {split}"
                    model.config._attn_implementation = implementation
                    cache = split_cache(model, batch, split)
                    self.assertEqual(model.config._attn_implementation,
                                     f"kvoffload_split_{implementation}", case)
                    self.assertEqual(greedy(model, cache, ids, mask).tolist(), expected, case)
                    stats = cache.stats()
                    length = PROMPT + NEW_TOKENS - 2  # committed before the last decode step
                    self.assertEqual(stats["split_rows_last"],
                                     [min(split, length)] * batch if split else [], case)
                    self.assertEqual(stats["split_bytes_saved"] > 0, split > 0, case)

    def test_a_split_moves_the_formula_fewer_bytes(self):
        model = model_of("qwen2", "eager")
        layers = describe_layers(model.config, MAX_CACHE_LEN)
        streamed = sum(1 for spec in layers if spec.attention == OFFLOADED)
        row = layers[0].kv.kv_heads * layers[0].kv.k_head_dim * 4  # f32 K (and V) row
        ids, mask = prompts(2, PROMPT, seed=5, pad_rows=(2, 0))
        moved = {}
        for split in (None, 7, PROMPT // 2):
            model.config._attn_implementation = "eager"
            cache = split_cache(model, 2, split)
            greedy(model, cache, ids, mask)
            moved[split] = cache.stats()
        for split in (7, PROMPT // 2):
            lengths = [PROMPT + step for step in range(NEW_TOKENS - 1)]  # each decode step's
            saved = sum(streamed * 2 * min(split, length) * 2 * row for length in lengths)
            self.assertEqual(moved[split]["split_bytes_saved"], saved, split)
            self.assertEqual(moved[split]["h2d_bytes_total"],
                             moved[None]["h2d_bytes_total"] - saved, split)
        self.assertNotIn("split_bytes_saved", moved[None])

    def test_quantized_rows_split_as_they_decode_unsplit(self):
        # int8 and fp8 K/V: the host part attends the quantized rows in place (dequantized by
        # the library), the device part the dequantized tail: the tokens of the unsplit run.
        model = model_of("llama3")
        ids, mask = prompts(1, PROMPT, seed=9)
        for kv_dtype in ("int8", "fp8"):
            runs = {}
            for split in (None, PROMPT // 2):
                model.config._attn_implementation = "sdpa"
                cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                             dtype=torch.float32, resident_layers=0,
                                             ring_depth=1, split=split, kv_dtype=kv_dtype)
                runs[split] = greedy(model, cache, ids, mask).tolist()
                if split:
                    self.assertGreater(cache.stats()["split_bytes_saved"], 0, kv_dtype)
            self.assertEqual(runs[PROMPT // 2], runs[None], kv_dtype)

    def test_the_host_part_is_attended(self):
        model = model_of("llama3")
        ids, mask = prompts(1, PROMPT, seed=6)
        expected = greedy(model, reference_cache(model), ids, mask).tolist()
        real = _native.lib.kvo_host_attention_run

        def zeroed(handle, view, q, rows, slots, begin, end, out, lse):
            status = real(handle, view, q, rows, slots, begin, end, out, lse)
            floats = rows * model.config.num_attention_heads * model.config.head_dim
            ctypes.memset(out, 0, floats * 4)  # the host part's outputs, zeroed
            return status

        _native.lib.kvo_host_attention_run = zeroed
        try:
            model.config._attn_implementation = "sdpa"
            got = greedy(model, split_cache(model, 1, PROMPT // 2), ids, mask).tolist()
        finally:
            _native.lib.kvo_host_attention_run = real
        self.assertNotEqual(got, expected)


class SplitRefusals(unittest.TestCase):
    def test_a_split_layer_attended_by_another_attention_is_refused(self):
        model = model_of("llama3")
        ids, mask = prompts(1, PROMPT, seed=7)
        cache = split_cache(model, 1, 4)
        model.config._attn_implementation = "sdpa"  # half on: the cache splits, sdpa attends
        with self.assertRaisesRegex(RuntimeError, "nothing attended it through kvoffload's split"):
            greedy(model, cache, ids, mask)
        cache.reset()
        model.config._attn_implementation = "sdpa"
        self.assertEqual(greedy(model, split_cache(model, 1, 4), ids, mask).tolist(),
                         greedy(model, reference_cache(model), ids, mask).tolist())

    def test_bad_splits_are_refused(self):
        model = model_of("llama3")
        for split in ("half", -1, 1.5, True, 2**31):
            with self.assertRaisesRegex(ValueError, "split is None"):
                split_cache(model, 1, split)


class SplitCompiled(unittest.TestCase):
    def test_fullgraph_compiled_decode_gives_the_same_tokens(self):
        torch._dynamo.reset()
        model = model_of("llama3")
        ids, mask = prompts(1, PROMPT, seed=8)
        expected = greedy(model, reference_cache(model), ids, mask).tolist()
        model.config._attn_implementation = "sdpa"
        recorder = GraphRecorder()
        for _ in range(2):  # a second generate, with a new cache, reuses the graph
            cache = split_cache(model, 1, PROMPT // 2)
            self.assertEqual(greedy(model, cache, ids, mask,
                                    compile_config=compile_config(recorder)).tolist(), expected)
            self.assertGreater(cache.stats()["split_bytes_saved"], 0)
        # One decode graph, whose streamed layers (all 4) attend through the opaque op.
        self.assertEqual(recorder.op_counts("kvoffload.attend"), [4])
        # The same compiled model with another cache (its keys are not a split cache's): the op
        # attends them whole, and the tokens are still StaticCache's.
        self.assertEqual(greedy(model, reference_cache(model), ids, mask,
                                compile_config=compile_config(recorder)).tolist(), expected)


if __name__ == "__main__":
    unittest.main()
