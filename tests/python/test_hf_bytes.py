"""What a generate costs the cache: the planned device and host bytes are what the constructor
allocated and what kvoffload/plan.hpp says, windows and states included; the bytes moved are
exactly the valid prefixes host->device and the new rows device->host; nothing is allocated after
construction, and what update returns are views of the cache's own buffers, not copies. And the
layouts the plan is made from (rows per layer, state shapes and dtypes, read from configs) are
the ones the models themselves store, for every tiny architecture the tests run."""

import math
import unittest

import torch
import transformers as tf
from transformers import AutoModelForCausalLM, DynamicCache

from kvoffload.hf import OffloadedStaticCache
from kvoffload.hf_layers import OFFLOADED, WINDOW, describe_layers, kv_layout
from tiny_models import ARCHITECTURES, MLA, WINDOW as WINDOW_ROWS, expected_plan, make_config
from tiny_models import make_model, prompts

MAX_CACHE_LEN = 48
PROMPT = 11
NEW_TOKENS = 9
BATCH = 3
RING = 2
FALCON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
BIGCODE = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4)


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
        original_update = cache.update

        def recording_update(key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = original_update(key_states, value_states, layer_idx, *args, **kwargs)
            rows = keys.shape[2]
            # [batch, kv_heads, len + n, head_dim], strided over the token-major buffer: the
            # strides kvoffload/hf_ops.py's fake implementation promises compiled code.
            self.assertEqual(tuple(keys.shape), (BATCH, 2, rows, 16))
            self.assertEqual(keys.stride(), (MAX_CACHE_LEN * 2 * 16, 16, 2 * 16, 1))
            seen["k"].setdefault(layer_idx, set()).add(keys.data_ptr())
            seen["v"].setdefault(layer_idx, set()).add(values.data_ptr())
            return keys, values

        cache.update = recording_update
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

    def test_windows_and_states_stay_where_they_were_allocated(self):
        # Gemma 3 (windows), Falcon-H1 (hybrid: states and offloaded keys) and LFM2 (convolution
        # states): every window and state buffer keeps its address through two generates, and the
        # native arena is still the one allocation made at construction.
        for name in ("gemma3", "falcon_h1", "lfm2"):
            model = make_model(name)
            cache = OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                         dtype=torch.float32, resident_layers=1)
            buffers = cache.device_buffers()
            self.assertTrue(buffers, name)
            addresses = [b.data_ptr() for b in buffers]
            run(model, cache)
            cache.reset()
            run(model, cache, seed=6)
            self.assertEqual([b.data_ptr() for b in cache.device_buffers()], addresses, name)
            self.assertEqual(cache.stats()["device_allocations"], 1, name)


class WindowsAndStatesInThePlan(unittest.TestCase):
    def test_device_bytes_include_every_window(self):
        # Gemma 3: layers 0 and 2 are 8-token windows of 2 heads x 16, keys and values in
        # float32; layers 1 and 3 are offloaded (both resident here).
        model = make_model("gemma3")
        cache = OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, resident_layers=2)
        plan = cache.plan()
        window_bytes = 2 * BATCH * WINDOW_ROWS * 2 * (16 + 16) * 4
        self.assertEqual(plan["window_layers"], 2)
        self.assertEqual(plan["window_bytes"], window_bytes)
        self.assertEqual(plan["offloaded_layers"], 2)
        self.assertEqual(plan["device_bytes"], plan["offloaded_device_bytes"] + window_bytes)
        self.assertEqual(plan["offloaded_device_bytes"], 2 * plan["layer_bytes"])
        self.assertEqual(sum(b.numel() * b.element_size() for b in cache.device_buffers()),
                         window_bytes)

    def test_device_bytes_include_every_state(self):
        # Qwen3-Next in bfloat16: layers 0 and 2 keep a convolution window of 2 * 16 + 32
        # channels x 4 taps (bfloat16) and a float32 recurrent state of 4 heads x 8 x 8.
        model = make_model("qwen3_next").to(torch.bfloat16)
        cache = OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.bfloat16)
        plan = cache.plan()
        per_row = (2 * 2 * 8 + 4 * 8) * 4 * 2 + 4 * 8 * 8 * 4
        self.assertEqual(plan["state_layers"], 2)
        self.assertEqual(plan["state_bytes"], 2 * BATCH * per_row)
        self.assertEqual(plan["device_bytes"], plan["offloaded_device_bytes"] + 2 * BATCH * per_row)
        self.assertEqual(sum(b.numel() * b.element_size() for b in cache.device_buffers()),
                         plan["state_bytes"])
        # The dtypes the model computes in: the convolution in bfloat16, the recurrence in float32.
        dtypes = {b.dtype for b in cache.device_buffers()}
        self.assertEqual(dtypes, {torch.bfloat16, torch.float32})
        run(model, cache)  # and the model runs on them

    def test_the_budget_pays_for_windows_and_states_first(self):
        # Falcon-H1: 4 hybrid layers, each a state here and offloaded keys and values. A budget
        # of the states, the ring of 2 and one resident layer, and a little less than a second
        # one: one layer resident.
        model = make_model("falcon_h1")
        probe = OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, resident_layers=0)
        layer, states = probe.plan()["layer_bytes"], probe.plan()["state_bytes"]
        self.assertGreater(states, 0)
        budget = states + (2 + 1 + 1) * layer - 256
        cache = OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, vram_budget=budget)
        self.assertEqual(cache.plan()["resident_layers"], 1)
        self.assertEqual(cache.plan()["device_bytes"], states + 3 * layer)
        with self.assertRaises(MemoryError) as raised:
            OffloadedStaticCache(model.config, BATCH, MAX_CACHE_LEN, device="cpu",
                                 dtype=torch.float32, vram_budget=states)
        self.assertIn("windows and states alone need", str(raised.exception))


class LayoutsFromTheConfig(unittest.TestCase):
    """What kvoffload reads from each config (kvoffload/hf_layers.py) against what the model
    stores in transformers' DynamicCache after a bfloat16 prefill of two rows."""

    def stored(self, name):
        model = make_model(name).to(torch.bfloat16)
        cache = DynamicCache(config=model.config)
        if model.config.model_type == "minimax":
            cache = None  # MiniMax makes its own
        with torch.no_grad():
            out = model(prompts(2, 5, seed=1)[0], cache=cache, use_cache=True)
        return model, out.cache

    def test_every_architecture(self):
        for name in ARCHITECTURES:
            model, stored = self.stored(name)
            specs = describe_layers(model.config, MAX_CACHE_LEN)
            linear = getattr(stored, "linear_cache", None)
            for spec, layer in zip(specs, stored.layers):
                case = f"{name} layer {spec.index} ({spec.layer_type})"
                if spec.attention is not None:
                    kv = spec.kv
                    self.assertEqual(tuple(layer.keys.shape[::2]) + (layer.keys.shape[3],),
                                     (2, 5, kv.k_head_dim), case)
                    self.assertEqual(layer.keys.shape[1], kv.kv_heads, case)
                    self.assertEqual(layer.values.shape[3], kv.v_head_dim, case)
                    if spec.attention == WINDOW:
                        self.assertEqual(spec.window, WINDOW_ROWS, case)
                for state in spec.states:
                    if state.kind == "linear":
                        tensor = linear[spec.index]
                    else:
                        tensor = getattr(layer, f"{state.kind}_states")[0]
                    self.assertEqual(tuple(tensor.shape), (2, *state.shape), case + " " + state.kind)
                    self.assertEqual(tensor.dtype, state.resolved_dtype(torch.bfloat16), case)
                if not spec.states and spec.attention is None:
                    self.fail(f"{case}: nothing kept")

    def test_falcon_and_gpt_bigcode_layouts(self):
        # Falcon-40B's new decoder architecture caches its 2 KV groups broadcast to all 4 heads;
        # Falcon-7B's and GPT-BigCode's multi_query cache one head; without it, every head.
        cases = {
            "falcon, new_decoder_architecture": (tf.FalconConfig(
                new_decoder_architecture=True, num_kv_heads=2, **FALCON), 4),
            "falcon, multi_query": (tf.FalconConfig(multi_query=True, **FALCON), 1),
            "falcon": (tf.FalconConfig(multi_query=False, **FALCON), 4),
            "gpt_bigcode, multi_query": (tf.GPTBigCodeConfig(multi_query=True, **BIGCODE), 1),
            "gpt_bigcode": (tf.GPTBigCodeConfig(multi_query=False, **BIGCODE), 4),
        }
        for case, (config, heads) in cases.items():
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config).eval()
            with torch.no_grad():
                out = model(prompts(2, 5, seed=1)[0], cache=DynamicCache(config=config),
                            use_cache=True)
            kv = kv_layout(config)
            self.assertEqual((kv.kv_heads, kv.k_head_dim, kv.v_head_dim), (heads, 16, 16), case)
            self.assertEqual(tuple(out.cache.layers[0].keys.shape), (2, heads, 5, 16), case)

    def test_multi_head_latent_attention(self):
        # DeepSeek V2/V3 cache the compressed latent as keys and the rope key as values, one head.
        for name in MLA:
            model, stored = self.stored(name)
            kv = kv_layout(make_config(name))
            self.assertEqual((kv.kv_heads, kv.k_head_dim, kv.v_head_dim), (1, 32, 8), name)
            for layer in stored.layers:
                self.assertEqual(tuple(layer.keys.shape), (2, 1, 5, 32), name)
                self.assertEqual(tuple(layer.values.shape), (2, 1, 5, 8), name)


if __name__ == "__main__":
    unittest.main()
