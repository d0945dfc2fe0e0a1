"""The CUDA backend under transformers: the same tokens as StaticCache on the GPU, also when
generate runs on a non-default current stream (the cache orders its work on torch's current
stream), for a sliding-window hybrid (Gemma 3) and a linear-attention hybrid (Qwen3-Next) too,
the exact bytes, no device allocation after construction, CUDA graphs with static shapes, and
split attention.
Skipped without a GPU (torch.cuda.is_available() is False) or without a CUDA build of
kvoffload."""

import time
import unittest

import torch
from transformers import CompileConfig, StaticCache

import kvoffload
from kvoffload.hf import OffloadedStaticCache
from cuda_required import needs_cuda
from tiny_models import make_model, prompts

MAX_CACHE_LEN = 64
NEW_TOKENS = 12
PROMPT = 16
BATCH = 3


@needs_cuda
class OnCuda(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.device = torch.device("cuda", torch.cuda.current_device())
        cls.model = make_model("llama3").to(cls.device)
        ids, mask = prompts(BATCH, PROMPT, seed=11, pad_rows=(0, 5, 2))
        cls.ids, cls.mask = ids.to(cls.device), mask.to(cls.device)
        cls.expected = cls.greedy(StaticCache(config=cls.model.config, max_cache_len=MAX_CACHE_LEN))

    @classmethod
    def greedy(cls, cache):
        return cls.model.generate(
            cls.ids, attention_mask=cls.mask, max_new_tokens=NEW_TOKENS, do_sample=False,
            cache=cache,
        )

    def make_cache(self, resident_layers, static_shapes=False):
        # Eager, valid rows only, unless asked: static shapes (the default) make generate
        # compile, which test_cuda_graphs_with_static_shapes checks.
        return OffloadedStaticCache(
            self.model.config, BATCH, MAX_CACHE_LEN, device=self.device, dtype=torch.float32,
            resident_layers=resident_layers, static_shapes=static_shapes,
        )

    def test_same_tokens_streamed_and_resident(self):
        for resident in (0, 1, 4):
            cache = self.make_cache(resident)
            self.assertEqual(cache.backend, "cuda")
            self.assertEqual(self.greedy(cache).tolist(), self.expected.tolist(), resident)
            cache.reset()
            self.assertEqual(self.greedy(cache).tolist(), self.expected.tolist(), resident)

    def test_split_attention_same_tokens(self):
        # The staged tails attended on the GPU, the rows before the split on the host in place
        # (row 1's five padding rows among them), merged on the GPU.
        original = self.model.config._attn_implementation
        try:
            cache = OffloadedStaticCache(
                self.model.config, BATCH, MAX_CACHE_LEN, device=self.device,
                dtype=torch.float32, resident_layers=0, static_shapes=False, split=8)
            self.assertEqual(self.greedy(cache).tolist(), self.expected.tolist())
            self.assertGreater(cache.stats()["split_bytes_saved"], 0)
        finally:
            self.model.config._attn_implementation = original

    def test_on_a_side_stream(self):
        cache = self.make_cache(0)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            got = self.greedy(cache)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.assertEqual(got.tolist(), self.expected.tolist())

    def test_windows_and_states_on_the_gpu(self):
        for name in ("gemma3", "qwen3_next"):
            model = make_model(name).to(self.device)
            ids, mask = prompts(2, PROMPT, seed=12, pad_rows=(3, 0))
            ids, mask = ids.to(self.device), mask.to(self.device)
            kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
            expected = model.generate(ids, cache=StaticCache(config=model.config,
                                                             max_cache_len=MAX_CACHE_LEN), **kwargs)
            cache = OffloadedStaticCache(model.config, 2, MAX_CACHE_LEN, device=self.device,
                                         dtype=torch.float32, resident_layers=1,
                                         static_shapes=False)
            addresses = [b.data_ptr() for b in cache.device_buffers()]
            self.assertTrue(all(b.is_cuda for b in cache.device_buffers()), name)
            self.assertEqual(model.generate(ids, cache=cache, **kwargs).tolist(),
                             expected.tolist(), name)
            self.assertEqual([b.data_ptr() for b in cache.device_buffers()], addresses, name)

    def test_bytes_and_allocations(self):
        cache = self.make_cache(1)
        before = cache.stats()
        self.assertEqual(before["device_allocations"], 1)
        self.greedy(cache)
        after = cache.stats()
        plan = after["plan"]
        row, streamed = plan["row_bytes"], plan["streamed_layers"]
        final = PROMPT + NEW_TOKENS - 1
        self.assertEqual(after["device_allocations"], 1)
        self.assertEqual(after["d2h_bytes_total"], 2 * streamed * BATCH * final * row)
        prefixes = sum(PROMPT + i for i in range(NEW_TOKENS - 1))
        next_step = 2 * min(plan["ring_depth"], streamed) * BATCH * final * row
        self.assertEqual(after["h2d_bytes_total"],
                         2 * streamed * BATCH * prefixes * row + next_step)

    def test_cuda_graphs_with_static_shapes(self):
        """generate's own CUDA path with static shapes: compiled (mode "reduce-overhead", CUDA
        graphs around the cache's update, which inductor keeps outside them: it is tagged
        cudagraph_unsafe), one graph for every decode step, StaticCache's tokens, streamed and
        resident. Prints decode tokens/s beside StaticCache's (also compiled)."""
        config = CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
        timings = {}
        for label, make in (("StaticCache", lambda: StaticCache(config=self.model.config,
                                                                 max_cache_len=MAX_CACHE_LEN)),
                            ("streamed", lambda: OffloadedStaticCache(  # static by default
                                self.model.config, BATCH, MAX_CACHE_LEN, device=self.device,
                                dtype=torch.float32, resident_layers=0)),
                            ("resident", lambda: self.make_cache(4, static_shapes=True))):
            torch._dynamo.reset()
            if hasattr(self.model, "_compiled_call"):
                del self.model._compiled_call
            torch._dynamo.utils.counters.clear()
            cache = make()
            if label != "StaticCache":
                self.assertTrue(cache.static_shapes and cache.is_compileable, label)
            got = self.model.generate(self.ids, attention_mask=self.mask, do_sample=False,
                                      max_new_tokens=NEW_TOKENS, cache=cache,
                                      compile_config=config)
            self.assertEqual(got.tolist(), self.expected.tolist(), label)
            self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 1, label)
            # Warm now: time a second generate on the same compiled graphs.
            cache.reset()
            torch.cuda.synchronize()
            start = time.perf_counter()
            self.model.generate(self.ids, attention_mask=self.mask, do_sample=False,
                                max_new_tokens=NEW_TOKENS, cache=cache, compile_config=config)
            torch.cuda.synchronize()
            timings[label] = NEW_TOKENS / (time.perf_counter() - start)
        print("decode tokens/s with CUDA graphs (tiny Llama, prefill included): " +
              ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    def test_a_new_cache_reuses_the_compiled_graph(self):
        """Defaults, as transformers' compile tests run them (fullgraph, dynamic=False, generate's
        own CUDA graphs): a second generate with a new cache of the same shape, and a shorter
        prompt, reuses the first one's graph."""
        config = CompileConfig(fullgraph=True, dynamic=False)
        torch._dynamo.reset()
        if hasattr(self.model, "_compiled_call"):
            del self.model._compiled_call
        torch._dynamo.utils.counters.clear()
        for length in (PROMPT, PROMPT - 5):
            ids, mask = self.ids[:, -length:], self.mask[:, -length:]
            expected = self.model.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                cache=StaticCache(config=self.model.config, max_cache_len=MAX_CACHE_LEN))
            cache = OffloadedStaticCache(self.model.config, BATCH, MAX_CACHE_LEN,
                                         device=self.device, dtype=torch.float32,
                                         resident_layers=0)
            got = self.model.generate(ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=NEW_TOKENS, cache=cache,
                                      compile_config=config)
            self.assertEqual(got.tolist(), expected.tolist(), f"a {length}-token prompt")
        self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 1)


if __name__ == "__main__":
    unittest.main()
