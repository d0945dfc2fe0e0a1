"""Misuse gets a clear error, raised before anything is changed: layers the cache cannot serve
(named, with why), dtype and device mismatches, a batch that is not max_batch_size, a generate
that would pass max_cache_len, beam search, bad sizes and budgets."""

import unittest
import warnings

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
    def test_states_of_an_unknown_family(self):
        config = qwen2_config(layer_types=["full_attention", "linear_attention"] * 2)
        with self.assertRaises(UnsupportedModelError) as raised:
            cpu_cache(config)
        message = str(raised.exception)
        self.assertIn("layer 1 (linear_attention): kvoffload allocates fixed-size states at "
                      "construction and does not know the sizes of qwen2's states", message)
        self.assertIn("layer 3 (linear_attention)", message)
        self.assertNotIn("layer 0", message)

    def test_shared_kv_and_indexer_layers(self):
        config = qwen2_config(layer_types=["full_attention", "full_attention",
                                           "indexed_attention", "full_attention"])
        config.kv_sharing_modes = [None, None, None, "reuse"]
        with self.assertRaises(UnsupportedModelError) as raised:
            cpu_cache(config)
        message = str(raised.exception)
        self.assertIn("layer 2 (indexed_attention): it keeps an indexer key cache", message)
        self.assertIn("layer 3 (dummy): it attends over keys and values another layer stored",
                      message)

    def test_unsupported_model_error_is_a_value_error(self):
        self.assertTrue(issubclass(UnsupportedModelError, ValueError))


class Windows(unittest.TestCase):
    def test_past_max_cache_len_with_windows_only(self):
        # Every layer of this Mistral is an 8-token window, which never overflows; the cache
        # still holds at most max_cache_len tokens per row, as promised.
        model = make_model("mistral_window")
        cache = cpu_cache(model, resident_layers=None)
        ids, mask = prompts(1, 6, seed=7)
        with self.assertRaises(ValueError) as raised:
            greedy(model, cache, ids, mask, 20)
        self.assertIn("the cache holds 24 tokens per row and this forward adds 1",
                      str(raised.exception))
        self.assertEqual(cache.get_seq_length(), 24)
        self.assertEqual(cache.plan()["offloaded_layers"], 0)

    def test_saving_a_model_with_windows_is_refused(self):
        model = make_model("gemma3")
        cache = cpu_cache(model)
        greedy(model, cache, *prompts(1, 6, seed=7), 2)
        with self.assertRaises(ValueError) as raised:
            cache.save("/nonexistent/never-written.kvo", model=model)
        self.assertIn("windows or states", str(raised.exception))


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

    def test_the_exact_length_is_enough(self):
        # prompt + max_new_tokens - 1 positions suffice (the last new token is never cached), and
        # the message asks for exactly that.
        cache = cpu_cache(self.model, max_cache_len=6 + 19 - 1)
        greedy(self.model, cache, self.ids, self.mask, 19)
        self.assertEqual(cache.get_seq_length(), 24)
        cache.reset()
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 20)
        self.assertIn("prompt length + max_new_tokens - 1", str(raised.exception))

    def test_a_resident_layers_request_raised_is_reported(self):
        # 4 layers, 3 asked resident: streaming 1 layer through a ring of 2 costs what keeping it
        # does, so all 4 stay, and the cache says so instead of changing the request silently.
        with self.assertWarns(UserWarning) as warned:
            cache = cpu_cache(self.model, resident_layers=3)
        self.assertIn("resident_layers=3 became 4", str(warned.warning))
        plan = cache.plan()
        self.assertEqual((plan["resident_layers"], plan["resident_layers_requested"]), (4, 3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            honoured = cpu_cache(self.model, resident_layers=1)  # 3 streamed > a ring of 2
        self.assertEqual(honoured.plan()["resident_layers"], 1)

    def test_prompt_longer_than_max_cache_len(self):
        cache = cpu_cache(self.model, max_cache_len=5)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 1)
        self.assertIn("6 would pass max_cache_len=5", str(raised.exception))
        self.assertEqual(cache.get_seq_length(), 0)

    def test_layer_idx_out_of_range(self):
        # A negative index would read another layer's rows (Python lists index from the end); one
        # past the model, or not an int, is refused too, before anything changes.
        cache = cpu_cache(self.model)
        layers = self.model.config.num_hidden_layers
        heads = self.model.config.num_key_value_heads
        head_dim = self.model.config.hidden_size // self.model.config.num_attention_heads
        states = torch.zeros(1, heads, 2, head_dim)
        for bad in (-3, -1, layers, 2**40):
            with self.assertRaises(IndexError, msg=str(bad)) as raised:
                cache.update(states, states, bad)
            self.assertIn(f"layer_idx {bad} is out of range", str(raised.exception))
            self.assertIn(f"the model has {layers} layers", str(raised.exception))
            with self.assertRaises(IndexError):
                cache.get_mask_sizes(2, bad)
        for bad in (1.0, "0", True, None):
            with self.assertRaises(TypeError, msg=repr(bad)):
                cache.update(states, states, bad)
        self.assert_untouched(cache)

    def test_beam_search_needs_a_slot_per_beam(self):
        # Beam search makes batch * num_beams rows: more than max_batch_size is refused, naming
        # it; a reorder that names a row outside the batch too.
        cache = cpu_cache(self.model, batch=1)
        with self.assertRaises(ValueError) as raised:
            greedy(self.model, cache, self.ids, self.mask, 3, num_beams=2)
        self.assertIn("max_batch_size", str(raised.exception))
        cache = cpu_cache(self.model, batch=2)
        with self.assertRaises(ValueError) as raised:
            cache.reorder_cache(torch.tensor([0, 2]))
        self.assertIn("beam_idx", str(raised.exception))


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

    def test_arguments_of_the_wrong_type_or_range_are_named(self):
        # Each refused in its own words, never a pybind11 "incompatible arguments" or a raw
        # AttributeError, and a float is never truncated to an int.
        config = qwen2_config()
        huge = qwen2_config()  # a crafted config claiming 2^31 layers: refused before any loop
        huge.num_hidden_layers = 2**31
        cases = [
            (TypeError, "config must be the model's config", lambda: OffloadedStaticCache(
                None, 1, 8, device="cpu", dtype=torch.float32)),
            (ValueError, "max_cache_len must be from 1 to 2147483647", lambda: cpu_cache(
                config, max_cache_len=2**40)),
            (ValueError, "max_batch_size must be from 1 to 2147483647", lambda: cpu_cache(
                config, batch=2**31)),
            (TypeError, "vram_budget must be bytes", lambda: cpu_cache(config, vram_budget=3.5)),
            (ValueError, "below 2^64", lambda: cpu_cache(config, vram_budget=2**70)),
            (TypeError, "resident_layers must be an int", lambda: cpu_cache(
                config, resident_layers="x")),
            (TypeError, "ring_depth must be an int", lambda: cpu_cache(config, ring_depth="2")),
            (ValueError, "ring_depth must be from 1 to 64", lambda: cpu_cache(
                config, ring_depth=2**40)),
            (TypeError, "kv_dtype must be None, a str ('fp8', 'int8') or a torch.dtype, got "
                        "list []", lambda: cpu_cache(config, kv_dtype=[])),
            (ValueError, "there is one CPU device (cpu, or cpu:0), not cpu:1", lambda: cpu_cache(
                config, device="cpu:1")),
            (TypeError, "device must be a torch.device", lambda: cpu_cache(config, device=[0])),
            (ValueError, "num_hidden_layers must be an int from 1 to 65536, got 2147483648",
             lambda: cpu_cache(huge)),
        ]
        for error, needle, call in cases:
            with self.assertRaises(error, msg=needle) as raised:
                call()
            self.assertIn(needle, str(raised.exception))
        cache = cpu_cache(config)
        with self.assertRaises(TypeError):
            cache.update([1], [2], 0)
        with self.assertRaises(ValueError) as raised:
            cache.update(torch.zeros(3), torch.zeros(3), 0)
        self.assertIn("must be [batch, kv heads, tokens, head size]", str(raised.exception))
        with self.assertRaises(ValueError):
            cache.get_mask_sizes(-1, 0)
        with self.assertRaises(TypeError):
            cache.crop("x")
        with self.assertRaisesRegex(TypeError, "path must be a str or os.PathLike"):
            cache.save(5, model=None)
        with self.assertRaisesRegex(TypeError, "path must be a str or os.PathLike"):
            OffloadedStaticCache.load(5, config)
        self.assertEqual(cache.get_seq_length(), 0)

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
