"""Misuse gets a clear error, raised before anything is changed: layers the cache cannot serve
(named, with why), dtype and device mismatches, a batch that is not max_batch_size, a generate
that would pass max_cache_len, beam search, bad sizes and budgets."""

import unittest

import torch
from transformers import StaticCache

import kvoffload
from kvoffload.hf import OffloadedStaticCache, UnsupportedModelError
from cuda_required import needs_cuda
from tiny_models import make_model, prompts, qwen2_config

MAX_CACHE_LEN = 24


def cpu_cache(model_or_config, batch=1, max_cache_len=MAX_CACHE_LEN, **kwargs):
    config = getattr(model_or_config, "config", model_or_config)
    kwargs.setdefault("dtype", torch.float32)
    kwargs.setdefault("device", "cpu")
    return OffloadedStaticCache(config, batch, max_cache_len, **kwargs)


def greedy(model, cache, ids, mask, new_tokens, **kwargs):
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, cache=cache, **kwargs
    )


class UnsupportedLayers(unittest.TestCase):
    def test_sliding_window_shorter_than_the_cache_names_the_layers(self):
        # Qwen2 with sliding windows of 8 tokens from layer 2 on.
        config = qwen2_config(use_sliding_window=True, sliding_window=8, max_window_layers=2)
        with self.assertRaises(UnsupportedModelError) as raised:
            cpu_cache(config)
        message = str(raised.exception)
        self.assertIn("2 layer(s)", message)
        self.assertIn("layer 2 (sliding_attention, window 8)", message)
        self.assertIn("layer 3 (sliding_attention, window 8)", message)
        self.assertNotIn("layer 1 ", message)
        self.assertIn("max_cache_len <= 8", message)
        # A cache no longer than the window: the window never hides a token, so it is served.
        cache = cpu_cache(config, max_cache_len=8)
        self.assertEqual(len(cache), 4)

    def test_linear_attention_layer(self):
        config = qwen2_config(layer_types=["full_attention", "linear_attention"] * 2)
        with self.assertRaises(UnsupportedModelError) as raised:
            cpu_cache(config)
        message = str(raised.exception)
        self.assertIn("layer 1 (linear_attention): it keeps a recurrent state", message)
        self.assertIn("layer 3 (linear_attention)", message)

    def test_unsupported_model_error_is_a_value_error(self):
        self.assertTrue(issubclass(UnsupportedModelError, ValueError))


class Mismatches(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = make_model("llama3")  # float32 on the CPU
        cls.ids, cls.mask = prompts(1, 6, seed=7)

    def assert_untouched(self, cache):
        # The failed call changed nothing: the cache still generates what StaticCache does.
        self.assertEqual(cache.get_seq_length(), 0)
        expected = greedy(
            self.model,
            StaticCache(config=self.model.config, max_cache_len=MAX_CACHE_LEN),
            self.ids,
            self.mask,
            4,
        )
        self.assertEqual(greedy(self.model, cache, self.ids, self.mask, 4).tolist(),
                         expected.tolist())

    def test_dtype(self):
        cache = cpu_cache(self.model, dtype=torch.bfloat16)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 2)
        message = str(raised.exception)
        self.assertIn("torch.float32", message)
        self.assertIn("torch.bfloat16", message)
        self.assertIn("dtype=model.dtype", message)
        self.assertEqual(cache.get_seq_length(), 0)

    def test_device(self):
        with self.assertRaises(ValueError) as raised:
            cpu_cache(self.model, device="meta")
        self.assertIn("cuda or cpu", str(raised.exception))

    @needs_cuda
    def test_cuda_cache_with_a_cpu_model(self):
        cache = OffloadedStaticCache(self.model.config, 1, MAX_CACHE_LEN, device="cuda",
                                     dtype=torch.float32)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 2)
        self.assertIn("device=model.device", str(raised.exception))

    def test_batch_larger_than_max_batch_size(self):
        cache = cpu_cache(self.model, batch=1)
        ids, mask = prompts(3, 6, seed=8)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, ids, mask, 2)
        message = str(raised.exception)
        self.assertIn("3 rows", message)
        self.assertIn("max_batch_size=1", message)
        self.assert_untouched(cache)

    def test_batch_smaller_than_max_batch_size_uses_the_first_slots(self):
        # A cache sized for 3 rows serves a batch of 1, and then a batch of 3 after reset(),
        # with exactly the tokens of transformers' own StaticCache.
        cache = cpu_cache(self.model, batch=3)
        for rows in (1, 3):
            ids, mask = prompts(rows, 6, seed=20 + rows)
            cache.reset()
            ours = greedy(self.model, cache, ids, mask, 5)
            theirs = greedy(self.model, StaticCache(config=self.model.config,
                                                    max_cache_len=MAX_CACHE_LEN), ids, mask, 5)
            self.assertEqual(ours.tolist(), theirs.tolist(), f"batch of {rows}")

    def test_past_max_cache_len_during_decode(self):
        # 6 prompt tokens + 20 new ones need 25 positions; the cache has 24. The error comes at
        # the step that would pass it, and nothing was reallocated.
        cache = cpu_cache(self.model)
        allocations = cache.stats()["device_allocations"]
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 20)
        message = str(raised.exception)
        self.assertIn("the cache holds 24 tokens per row and this forward adds 1", message)
        self.assertIn("max_cache_len=24", message)
        self.assertEqual(cache.get_seq_length(), 24)
        self.assertEqual(cache.stats()["device_allocations"], allocations)
        cache.reset()
        self.assert_untouched(cache)

    def test_prompt_longer_than_max_cache_len(self):
        cache = cpu_cache(self.model, max_cache_len=5)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 1)
        self.assertIn("6 would pass max_cache_len=5", str(raised.exception))
        self.assertEqual(cache.get_seq_length(), 0)

    def test_beam_search(self):
        # Beam search makes batch * num_beams rows and reorders them: refused.
        cache = cpu_cache(self.model, batch=2)
        with self.assertRaises(NotImplementedError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 3, num_beams=2)
        self.assertIn("beam search", str(raised.exception))


class Construction(unittest.TestCase):
    def test_bad_sizes(self):
        config = qwen2_config()
        for kwargs in ({"max_batch_size": 0, "max_cache_len": 8},
                       {"max_batch_size": 1, "max_cache_len": -3},
                       {"max_batch_size": 1.5, "max_cache_len": 8}):
            with self.assertRaises(ValueError, msg=str(kwargs)):
                OffloadedStaticCache(config, device="cpu", dtype=torch.float32, **kwargs)
        with self.assertRaises(ValueError):
            cpu_cache(config, resident_layers=5)  # the model has 4 layers
        with self.assertRaises(ValueError) as raised:
            cpu_cache(config, dtype=torch.int8)
        self.assertIn("float32, float16 or bfloat16", str(raised.exception))

    def test_budget_too_small_names_the_bytes(self):
        with self.assertRaises(MemoryError) as raised:
            cpu_cache(qwen2_config(), vram_budget="1KiB")
        message = str(raised.exception)
        self.assertIn("the budget is 1.00 KiB", message)
        self.assertIn("missing 11.00 KiB", message)  # a ring of 2 layers of 6 KiB each
        with self.assertRaises(ValueError):
            cpu_cache(qwen2_config(), vram_budget="lots")

    def test_crop(self):
        model = make_model("qwen2")
        ids, mask = prompts(1, 6, seed=9)
        cache = cpu_cache(model)
        greedy(model, cache, ids, mask, 4)
        self.assertEqual(cache.get_seq_length(), 9)
        cache.crop(-2)
        self.assertEqual(cache.get_seq_length(), 7)
        with self.assertRaises(ValueError):
            cache.crop(3)


if __name__ == "__main__":
    unittest.main()
