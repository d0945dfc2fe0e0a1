"""What a generate costs the cache: the planned device and host bytes are what the constructor
allocated and what kvoffload/plan.hpp says; the bytes moved are exactly the valid prefixes
host->device and the new rows device->host; nothing is allocated after construction, and what
update returns are views of the cache's own buffers, not copies."""

import unittest

import torch

from kvoffload.hf import OffloadedStaticCache
from tiny_models import expected_plan, make_model, prompts

MAX_CACHE_LEN = 48
PROMPT = 11
NEW_TOKENS = 9
BATCH = 3
RING = 2


def run(model, cache, seed=5):
    ids, mask = prompts(BATCH, PROMPT, seed=seed, pad_rows=(3, 0, 6))
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache
    )


def expected_moves(plan):
    """(h2d, d2h) bytes of one generate from an empty cache, per kvoffload/cache.hpp: a step
    moves each streamed layer's valid prefix (the rows held before the step, every slot) up and
    the step's new rows down, K and V. The prefill (PROMPT rows) has nothing to move up; each of
    the NEW_TOKENS - 1 decode steps appends one row per slot. After the last step the ring has
    already prefetched the next step's first ring_depth streamed layers."""
    row, streamed = plan["row_bytes"], plan["streamed_layers"]
    prefixes = [PROMPT + i for i in range(NEW_TOKENS - 1)]  # held before each decode step
    h2d = sum(2 * streamed * BATCH * held * row for held in prefixes)
    final = PROMPT + NEW_TOKENS - 1
    h2d += 2 * min(plan["ring_depth"], streamed) * BATCH * final * row
    d2h = 2 * streamed * BATCH * final * row
    return h2d, d2h


class BytesMatchThePlan(unittest.TestCase):
    def check(self, resident, dtype, element_size):
        model = make_model("qwen2").to(dtype)
        cache = OffloadedStaticCache(
            model.config,
            max_batch_size=BATCH,
            max_cache_len=MAX_CACHE_LEN,
            device="cpu",
            dtype=dtype,
            resident_layers=resident,
            ring_depth=RING,
        )
        want = expected_plan(model.config, BATCH, MAX_CACHE_LEN, element_size, resident, RING)
        before = cache.stats()
        for key, value in want.items():
            if key != "layer_bytes":
                self.assertEqual(before["plan"][key], value, key)
        self.assertEqual(before["plan"]["layer_bytes"], want["layer_bytes"])
        self.assertEqual(before["device_allocations"], 1)  # one arena, at construction

        run(model, cache)
        after = cache.stats()
        self.assertEqual(after["plan"], before["plan"])
        self.assertEqual(after["steps"], NEW_TOKENS)  # one prefill and NEW_TOKENS - 1 decodes
        h2d, d2h = expected_moves(after["plan"])
        self.assertEqual(after["h2d_bytes_total"], h2d)
        self.assertEqual(after["d2h_bytes_total"], d2h)
        self.assertEqual(after["device_allocations"], 1)  # nothing allocated by generate
        return cache, after

    def test_streamed_float32(self):
        self.check(resident=0, dtype=torch.float32, element_size=4)

    def test_partly_resident_bfloat16(self):
        cache, stats = self.check(resident=1, dtype=torch.bfloat16, element_size=2)
        self.assertGreater(stats["h2d_bytes_total"], 0)

    def test_all_resident_moves_nothing(self):
        cache, stats = self.check(resident=4, dtype=torch.float32, element_size=4)
        self.assertEqual(stats["plan"]["host_bytes"], 0)
        self.assertEqual(stats["h2d_bytes_total"], 0)
        self.assertEqual(stats["d2h_bytes_total"], 0)

    def test_vram_budget_decides_the_resident_layers(self):
        # A budget of one resident layer plus the ring, and a little less than one more layer:
        # the planner keeps layer 0 resident and streams layers 1..3.
        model = make_model("llama3")
        want = expected_plan(model.config, BATCH, MAX_CACHE_LEN, 4, resident=1, ring_depth=RING)
        budget = (2 + RING) * want["layer_bytes"] - 256
        cache = OffloadedStaticCache(
            model.config, BATCH, MAX_CACHE_LEN, device="cpu", dtype=torch.float32,
            vram_budget=budget,
        )
        self.assertEqual(cache.plan()["resident_layers"], 1)
        self.assertEqual(cache.plan()["device_bytes"], (1 + RING) * want["layer_bytes"])
        # The same budget written as a size string.
        cache = OffloadedStaticCache(
            model.config, BATCH, MAX_CACHE_LEN, device="cpu", dtype=torch.float32,
            vram_budget=f"{budget}B",
        )
        self.assertEqual(cache.plan()["resident_layers"], 1)


class NothingAllocatedDuringGenerate(unittest.TestCase):
    def test_update_returns_views_of_the_cache_buffers(self):
        # Layer 0 resident, layers 1..3 streamed through 2 staging buffers: every key (and value)
        # tensor update returns during a whole generate starts at one of 1 + 2 fixed addresses,
        # the same from the first step to the last, and the resident layer always at its own.
        model = make_model("llama3")
        cache = OffloadedStaticCache(
            model.config, BATCH, MAX_CACHE_LEN, device="cpu", dtype=torch.float32,
            resident_layers=1, ring_depth=RING,
        )
        seen = {"k": {}, "v": {}}
        original_update = cache._update

        def recording_update(key_states, value_states, layer_idx, args, kwargs):
            keys, values = original_update(key_states, value_states, layer_idx, args, kwargs)
            rows = keys.shape[2]
            # [batch, kv_heads, len + n, head_dim], strided over the token-major buffer.
            self.assertEqual(tuple(keys.shape), (BATCH, 2, rows, 16))
            self.assertEqual(keys.stride()[1:], (16, 2 * 16, 1))
            seen["k"].setdefault(layer_idx, set()).add(keys.data_ptr())
            seen["v"].setdefault(layer_idx, set()).add(values.data_ptr())
            return keys, values

        cache._update = recording_update
        allocations = cache.stats()["device_allocations"]
        run(model, cache)
        cache.reset()
        run(model, cache, seed=6)  # and a second generate after reset()
        self.assertEqual(cache.stats()["device_allocations"], allocations)
        for kind in ("k", "v"):
            per_layer = seen[kind]
            self.assertEqual(sorted(per_layer), [0, 1, 2, 3])
            self.assertEqual(len(per_layer[0]), 1, "the resident layer moved")
            every = set().union(*per_layer.values())
            self.assertEqual(len(every), 1 + RING, f"{kind}: {len(every)} distinct buffers")
        # Keys and values live in different places.
        self.assertFalse(set().union(*seen["k"].values()) & set().union(*seen["v"].values()))


if __name__ == "__main__":
    unittest.main()
