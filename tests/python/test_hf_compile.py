"""The decode forward compiles with torch.compile(fullgraph=True), the cache inside the graph
(the offloaded update as the custom op kvoffload::update, windows and states as plain tensor
code), and generates the tokens transformers' StaticCache gives without compiling:

- torch.compile(model.forward, fullgraph=True) on a Llama with one layer resident and three
  streamed, the eager backend, with the graphs dynamo captured inspected;
- generate's own compile path (compile_config, on the CPU with _compile_all_devices) with the
  inductor backend, on a two-layer Llama (one resident, one streamed): fake tensors, generated C++
  kernels and the op's strides together;
- the same path, eager backend, on Gemma 3 (windows) and Qwen3-Next (states);
- with default arguments, as transformers' compile tests run it (dynamic=False): one graph for
  every decode step of several generates, each with a new cache and a shorter prompt.

fullgraph=True makes any graph break an error, so passing means no break at the cache."""

import unittest

import torch
from transformers import CompileConfig, StaticCache

from greedy import MAX_CACHE_LEN, NEW_TOKENS, greedy, offloaded, reference_cache
from kvoffload.hf import OffloadedStaticCache
from kvoffload.hf_local import WindowLayer
from tiny_models import make_model, prompts


class GraphRecorder:
    """A torch.compile backend that runs each graph as captured (eager) and keeps the ops of
    each."""

    def __init__(self):
        self.graphs = []

    def __deepcopy__(self, memo):  # CompileConfig.to_dict deep-copies its backend
        return self

    def __call__(self, graph_module, example_inputs):
        self.graphs.append([str(node.target) for node in graph_module.graph.nodes
                            if node.op == "call_function"])
        return graph_module.forward

    def op_counts(self, name="kvoffload.update"):
        return [sum(name in target for target in graph) for graph in self.graphs]


def decode_loop(model, forward, cache, ids, mask):
    """Greedy tokens: the prompt's forward eagerly, then NEW_TOKENS - 1 one-token forwards through
    `forward`, with the positions and 2-D mask generate would pass."""
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        tokens = [ids, token]
        for _ in range(NEW_TOKENS - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = (mask.cumsum(-1) - 1)[:, -1:]
            out = forward(input_ids=token, attention_mask=mask, position_ids=positions, cache=cache,
                          use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            tokens.append(token)
    return torch.cat(tokens, dim=1)


def compile_config(backend):
    config = CompileConfig(backend=backend, fullgraph=True,
                           mode="default" if backend == "inductor" else None)
    config._compile_all_devices = True  # generate compiles on the CPU only when asked to
    return config


class FullGraph(unittest.TestCase):
    def setUp(self):
        torch._dynamo.reset()

    def test_compiled_forward_has_the_cache_in_its_graph(self):
        model = make_model("llama3")
        ids, mask = prompts(2, 12, seed=1, pad_rows=(3, 0))
        expected = decode_loop(model, model.forward,
                               StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                               ids, mask)
        recorder = GraphRecorder()
        compiled = torch.compile(model.forward, fullgraph=True, backend=recorder)
        # Valid rows only: the lengths are Python ints, which dynamo makes symbolic.
        cache = offloaded(model, 2, resident_layers=1, static_shapes=False)
        self.assertEqual(decode_loop(model, compiled, cache, ids, mask).tolist(),
                         expected.tolist())
        # Decoding compiled once for the first length and once with the length symbolic, each
        # graph with the four layers' updates in it; the symbolic one served every later step.
        self.assertEqual(recorder.op_counts(), [4] * len(recorder.graphs))
        self.assertLessEqual(len(recorder.graphs), 2)
        self.assertEqual(cache.get_seq_length(), 12 + NEW_TOKENS - 1)
        # New caches of the same shape reuse the graphs: the op names its cache by a tensor,
        # whose value dynamo does not guard.
        graphs = len(recorder.graphs)
        for resident in (0, 2, 4):
            cache = offloaded(model, 2, resident_layers=resident, static_shapes=False)
            self.assertEqual(decode_loop(model, compiled, cache, ids, mask).tolist(),
                             expected.tolist(), f"a new cache, resident_layers={resident}")
        self.assertEqual(len(recorder.graphs), graphs, "a new cache recompiled")

    def test_generate_compile_path_with_inductor(self):
        model = make_model("llama3", num_hidden_layers=2)
        ids, mask = prompts(2, 12, seed=2, pad_rows=(0, 4))
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask)
        cache = offloaded(model, 2, resident_layers=1)
        self.assertTrue(cache.is_compileable)
        got = greedy(model, cache, ids, mask, compile_config=compile_config("inductor"))
        self.assertEqual(got.tolist(), expected.tolist())
        self.assertTrue(hasattr(model, "_compiled_call"), "generate did not compile")
        # Static shapes under inductor with dynamic=False: one graph for every decode step.
        torch._dynamo.reset()
        del model._compiled_call
        torch._dynamo.utils.counters.clear()
        config = compile_config("inductor")
        config.dynamic = False
        cache = offloaded(model, 2, resident_layers=1, static_shapes=True)
        got = greedy(model, cache, ids, mask, compile_config=config)
        self.assertEqual(got.tolist(), expected.tolist())
        self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 1)

    def test_generate_compile_path_with_windows_and_states(self):
        for name in ("gemma3", "qwen3_next"):
            torch._dynamo.reset()
            model = make_model(name)
            ids, mask = prompts(2, 12, seed=3, pad_rows=(2, 0))
            expected = greedy(model, reference_cache(model), ids, mask)
            recorder = GraphRecorder()
            config = compile_config("eager")
            config.backend = recorder
            cache = offloaded(model, 2, resident_layers=1)
            got = greedy(model, cache, ids, mask, compile_config=config)
            self.assertEqual(got.tolist(), expected.tolist(), name)
            self.assertTrue(recorder.graphs, f"{name}: generate did not compile")
            self.assertEqual(set(recorder.op_counts()), {2}, name)  # two offloaded layers


def fixed_shapes_config(recorder):
    """generate's compile path as transformers' own compile tests run it: fullgraph, no dynamic
    shapes (so a shape or a Python int that changes means a recompile), the graphs recorded."""
    config = CompileConfig(backend=recorder, fullgraph=True, dynamic=False, mode=None)
    config._compile_all_devices = True
    return config


class StaticShapes(unittest.TestCase):
    """static_shapes=True: every update of an offloaded layer returns max_cache_len rows, the
    masks have max_cache_len columns, and the decode step compiles once under dynamic=False, as
    with transformers' StaticCache (without it, every step is a new shape and generate hits
    dynamo's recompile limit)."""

    TOKENS = 20  # past dynamo's recompile limit (8) if any step recompiled

    def setUp(self):
        torch._dynamo.reset()

    def compiled_greedy(self, model, cache, ids, mask):
        recorder = GraphRecorder()
        if hasattr(model, "_compiled_call"):
            del model._compiled_call  # generate keeps one compiled forward per model
        tokens = greedy(model, cache, ids, mask, new_tokens=self.TOKENS,
                        compile_config=fixed_shapes_config(recorder))
        return tokens, recorder

    def test_decode_compiles_once_resident_and_streamed(self):
        # qwen3_next: 2 of its 4 layers attend, both streamed through a ring of one buffer, or
        # both resident.
        for name, layers, ring, residents in (("llama3", 4, 2, (0, 1, 4)),
                                               ("qwen3_next", 2, 1, (0, 2))):
            model = make_model(name)
            ids, mask = prompts(2, 12, seed=4, pad_rows=(3, 0))
            expected, reference = self.compiled_greedy(
                model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN), ids, mask)
            self.assertEqual(len(reference.graphs), 1, f"{name}: StaticCache recompiled")
            for resident in residents:
                torch._dynamo.reset()
                cache = offloaded(model, 2, resident_layers=resident, ring_depth=ring,
                                  static_shapes=True)
                self.assertTrue(cache.is_compileable)
                self.assertEqual(cache.plan()["streamed_layers"], layers - resident)
                got, recorder = self.compiled_greedy(model, cache, ids, mask)
                where = f"{name}, resident_layers={resident}"
                self.assertEqual(got.tolist(), expected.tolist(), where)
                self.assertEqual(len(recorder.graphs), 1, f"{where}: the decode step recompiled")
                self.assertEqual(recorder.op_counts(), [layers], where)
                self.assertEqual(cache.get_seq_length(), 12 + self.TOKENS - 1, where)
                if resident < layers:
                    self.assertGreater(cache.stats()["h2d_bytes_total"], 0, where)

    def test_windows_compile_once(self):
        # A window of 8 rows under a 12-token prompt and 19 decode steps: full from the start.
        # transformers' StaticCache recompiles here at every step (its sliding layers count in a
        # Python int) and stops at the limit, so the reference is its eager run.
        for name in ("gpt_oss", "gemma3"):
            torch._dynamo.reset()
            model = make_model(name)
            ids, mask = prompts(2, 12, seed=7, pad_rows=(0, 3))
            expected = greedy(model, reference_cache(model), ids, mask, new_tokens=self.TOKENS)
            for resident in (0, 1):
                torch._dynamo.reset()
                cache = offloaded(model, 2, resident_layers=resident, ring_depth=1,
                                  static_shapes=True)
                got, recorder = self.compiled_greedy(model, cache, ids, mask)
                where = f"{name}, resident_layers={resident}"
                self.assertEqual(got.tolist(), expected.tolist(), where)
                self.assertEqual(len(recorder.graphs), 1, f"{where}: the decode step recompiled")
                self.assertEqual(cache.get_seq_length(), 12 + self.TOKENS - 1, where)
                windows = [layer for layer in cache.layers if isinstance(layer, WindowLayer)]
                self.assertTrue(windows, name)
                self.assertEqual({layer.seen for layer in windows}, {12 + self.TOKENS - 1})
        # While a window is not yet full it returns all its rows and says so in its mask sizes;
        # a crop back into it restores what it held.
        model = make_model("gemma3")
        cache = offloaded(model, 1, static_shapes=True)
        window = next(layer for layer in cache.layers if isinstance(layer, WindowLayer))
        k = torch.randn(1, cache.num_key_value_heads, 3, cache.head_dim)
        keys, _ = window.update(k, k)
        self.assertEqual(keys.shape[2], window.window)
        self.assertEqual(window.get_mask_sizes(1), (window.window, 0))
        self.assertEqual(window.get_mask_sizes(window.window), (3 + window.window, 0))

    def test_quantized_rows_compile_once(self):
        model = make_model("llama3")
        ids, mask = prompts(2, 10, seed=5, pad_rows=(0, 2))
        eager = greedy(model, offloaded(model, 2, resident_layers=1, kv_dtype="int8"), ids, mask,
                       new_tokens=self.TOKENS)
        cache = offloaded(model, 2, resident_layers=1, kv_dtype="int8", static_shapes=True)
        got, recorder = self.compiled_greedy(model, cache, ids, mask)
        self.assertEqual(got.tolist(), eager.tolist())
        self.assertEqual(len(recorder.graphs), 1)

    def test_eager_rows_masks_and_lengths(self):
        model = make_model("llama3")
        ids, mask = prompts(2, 12, seed=6, pad_rows=(2, 0))
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask)
        cache = offloaded(model, 2, resident_layers=1, static_shapes=True)
        self.assertEqual(greedy(model, cache, ids, mask).tolist(), expected.tolist())
        self.assertEqual(cache.get_mask_sizes(1, 0), (MAX_CACHE_LEN, 0))
        self.assertEqual(cache.get_seq_length(), 12 + NEW_TOKENS - 1)
        cache.reset()
        k = torch.randn(2, cache.num_key_value_heads, 3, cache.head_dim)
        keys, values = cache.update(k, k.clone(), 0)
        self.assertEqual(tuple(keys.shape), (2, k.shape[1], MAX_CACHE_LEN, cache.head_dim))
        torch.testing.assert_close(keys[:, :, :3], k, rtol=0, atol=0)
        self.assertTrue(torch.isfinite(keys).all() and torch.isfinite(values).all())
        # Crop back, then continue: the Python length follows the native cache's.
        for layer in range(1, 4):
            cache.update(k, k, layer)
        cache.crop(-2)
        self.assertEqual(cache.get_seq_length(), 1)
        with self.assertRaises(TypeError):
            offloaded(model, 1, static_shapes="yes")
        self.assertTrue(offloaded(model, 1).static_shapes)  # the default, on the CPU too
        # Eagerly, a window filling up step by step (4-token prompt, window 8): whole windows
        # returned while not full, the mask sizes to match.
        model = make_model("gpt_oss")
        ids, mask = prompts(2, 4, seed=8, pad_rows=(1, 0))
        expected = greedy(model, reference_cache(model), ids, mask, new_tokens=12)
        cache = offloaded(model, 2, resident_layers=1, static_shapes=True)
        self.assertEqual(greedy(model, cache, ids, mask, new_tokens=12).tolist(),
                         expected.tolist())


class CompilesOnceByDefault(unittest.TestCase):
    """With default arguments, generate's compile path as transformers' own compile tests run it
    (fullgraph=True, dynamic=False) compiles the decode step once, and further generates, each
    with a new cache of the same shape and a shorter prompt, reuse that graph: nothing dynamo
    guards on differs between two caches of one shape. The tokens are StaticCache's."""

    TOKENS = 12

    def setUp(self):
        torch._dynamo.reset()

    def test_new_caches_and_shorter_prompts_reuse_one_graph(self):
        # llama3: 4 full layers, every one resident, or every one streamed; gemma2: windows
        # beside 2 full layers; qwen3_next: states beside 2 full layers (streamed through a
        # ring of one buffer: two would hold them all).
        for name, resident, ring in (("llama3", 4, 2), ("llama3", 0, 2), ("gemma2", 0, 1),
                                     ("qwen3_next", 0, 1)):
            torch._dynamo.reset()
            model = make_model(name)
            recorder = GraphRecorder()
            config = fixed_shapes_config(recorder)
            for round_, (length, seed, pads) in enumerate(((12, 21, (3, 0)), (9, 22, (0, 2)),
                                                           (5, 23, (1, 0)))):
                where = f"{name}, resident_layers={resident}, generate {round_ + 1}"
                ids, mask = prompts(2, length, seed=seed, pad_rows=pads)
                expected = greedy(model, reference_cache(model), ids, mask,
                                  new_tokens=self.TOKENS)
                cache = offloaded(model, 2, resident_layers=resident, ring_depth=ring)
                self.assertTrue(cache.static_shapes and cache.is_compileable, where)
                got = greedy(model, cache, ids, mask, new_tokens=self.TOKENS,
                             compile_config=config)
                self.assertEqual(got.tolist(), expected.tolist(), where)
                self.assertEqual(len(recorder.graphs), 1, f"{where}: compiled again")
                if resident == 0:
                    self.assertGreater(cache.stats()["h2d_bytes_total"], 0, where)

    def test_bf16_logits_are_static_caches_bit_for_bit(self):
        # In bf16 a softmax over the valid columns alone rounds differently from StaticCache's
        # over every column; by default the cache returns every row, so the logits are the same
        # bits, eagerly, resident and streamed.
        model = make_model("llama3").to(torch.bfloat16)
        ids, mask = prompts(2, 12, seed=24, pad_rows=(2, 0))

        def scores(cache):
            out = model.generate(ids, attention_mask=mask, max_new_tokens=self.TOKENS,
                                 do_sample=False, cache=cache, output_logits=True,
                                 return_dict_in_generate=True)
            return out.sequences, torch.stack(out.logits)

        tokens, logits = scores(StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN))
        for resident in (4, 0):
            cache = OffloadedStaticCache(model.config, 2, MAX_CACHE_LEN, device="cpu",
                                         dtype=torch.bfloat16, resident_layers=resident)
            got_tokens, got_logits = scores(cache)
            self.assertEqual(got_tokens.tolist(), tokens.tolist(), f"resident={resident}")
            self.assertTrue(torch.equal(got_logits, logits), f"resident={resident}: logits")


if __name__ == "__main__":
    unittest.main()
