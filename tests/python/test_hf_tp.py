"""kvoffload.hf under transformers tensor parallelism, on the CPU: two ranks over gloo
(``torchrun --nproc-per-node 2``, tp_worker.py), tiny Llama-shaped models of 4 KV heads (one query
head each) and of 2 KV heads with 4 query heads each, Gemma 2 (sliding windows) and DeepSeek V3
(multi-head latent attention, which transformers leaves whole on every rank).

What must hold: each rank's greedy tokens, every layer streamed through the ring, equal the tokens
of one process with transformers' StaticCache; both ranks report the same plan; each rank's host
store is exactly half of the single-process one where KV heads are sharded, and all of it where
attention is replicated; ranks given different budgets agree on the smaller plan; a context saved
under two ranks resumes under two ranks and is refused, naming both world sizes, by one process;
a model with fewer KV heads than ranks, and one with states, are refused by name.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from transformers import StaticCache

import kvoffload
from kvoffload.hf import OffloadedStaticCache
from tiny_models import make_model

HERE = os.path.dirname(os.path.abspath(__file__))
NEW_TOKENS = 32
MAX_CACHE_LEN = 48

MODELS = {  # name -> (architecture, overrides)
    "kv4": ("llama3", dict(num_attention_heads=4, num_key_value_heads=4)),
    "kv2_gqa4": ("llama3", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=16)),
    "kv1": ("llama3", dict(num_attention_heads=4, num_key_value_heads=1)),
    # 3 full layers: one more than the ring, so that they stream.
    "gemma2": ("gemma2", dict(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=6)),
    "deepseek_v3": ("deepseek_v3", dict()),
}


def single_process(model, ids, new_tokens=NEW_TOKENS, cache=None):
    cache = cache or StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    return model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                          cache=cache)[0].tolist()


class TensorParallelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        models = os.path.join(cls.dir.name, "models")
        cls.out = os.path.join(cls.dir.name, "out")
        os.makedirs(cls.out)
        generator = torch.Generator().manual_seed(11)
        cls.ids = torch.randint(2, 128, (1, 8), generator=generator)
        os.makedirs(models)
        with open(os.path.join(models, "prompt.json"), "w") as f:
            json.dump(cls.ids.tolist(), f)
        cls.expected, cls.single = {}, {}
        for name, (architecture, overrides) in MODELS.items():
            model = make_model(architecture, seed=3, **overrides)
            model.save_pretrained(os.path.join(models, name))
            if name == "kv1":
                continue
            cls.expected[name] = single_process(model, cls.ids)
            cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                         dtype=torch.float32, resident_layers=0)
            cls.single[name] = (single_process(model, cls.ids, cache=cache), cache.plan(),
                                cache.stats()["h2d_bytes_total"])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.dirname(os.path.dirname(kvoffload.__file__)), HERE,
             env.get("PYTHONPATH", "")])
        env["OMP_NUM_THREADS"] = "1"
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", "2", os.path.join(HERE, "tp_worker.py"), models, cls.out],
            env=env, capture_output=True, text=True, timeout=240)
        cls.log = run.stdout + run.stderr
        cls.ranks = []
        for rank in (0, 1):
            path = os.path.join(cls.out, f"rank{rank}.json")
            if os.path.exists(path):
                with open(path) as f:
                    cls.ranks.append(json.load(f))
        if run.returncode != 0 or len(cls.ranks) != 2:
            raise AssertionError(f"torchrun failed ({run.returncode}):\n{cls.log[-6000:]}")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_tokens_equal_one_process(self):
        for name in ("kv4", "kv2_gqa4", "gemma2", "deepseek_v3"):
            with self.subTest(name):
                self.assertEqual(self.single[name][0], self.expected[name])  # the cache alone
                for rank in self.ranks:
                    self.assertEqual(rank[name]["tokens"], self.expected[name])
                    self.assertGreater(rank[name]["h2d"], 0)  # streamed, not resident

    def test_each_rank_holds_its_share(self):
        for name, sharded in (("kv4", True), ("kv2_gqa4", True), ("gemma2", True),
                              ("deepseek_v3", False)):
            with self.subTest(name):
                single = self.single[name][1]
                plans = [rank[name]["plan"] for rank in self.ranks]
                for r, plan in enumerate(plans):
                    self.assertEqual((plan["rank"], plan["world_size"]), (r, 2))
                    self.assertEqual(plan["kv_heads_sharded"], sharded)
                    self.assertEqual(plan["streamed_layers"], single["streamed_layers"])
                    share = 2 if sharded else 1
                    self.assertEqual(plan["host_bytes"] * share, single["host_bytes"])
                    # (every tensor here is a whole number of 256-byte blocks on both sides)
                    self.assertEqual(plan["device_bytes"] * share, single["device_bytes"])
                    self.assertEqual(plan["window_bytes"] * share, single["window_bytes"])
                    self.assertEqual(plan["kv_heads"] * share, single["kv_heads"])
                    # and over the bus, its heads' rows alone
                    self.assertEqual(self.ranks[r][name]["h2d"] * share, self.single[name][2])
                    if sharded:
                        self.assertEqual(plan["kv_head_begin"], r * plan["kv_heads"])
                # The same plan but for the rank's own heads (and the host memory each found
                # available, measured when it was built).
                same = [{k: v for k, v in p.items()
                         if k not in ("rank", "kv_head_begin", "host_share_bytes")} for p in plans]
                self.assertTrue(all(p["host_share_bytes"] > 0 for p in plans))
                self.assertEqual(same[0], same[1])
        self.assertEqual(self.single["kv2_gqa4"][1]["kv_heads"], 2)
        self.assertEqual(self.ranks[0]["kv2_gqa4"]["plan"]["kv_heads"], 1)

    def test_ranks_with_different_budgets_agree(self):
        plans = [rank["budgets"]["plan"] for rank in self.ranks]
        budgets = [rank["budgets"]["budget"] for rank in self.ranks]
        self.assertNotEqual(budgets[0], budgets[1])
        # Rank 1's budget holds one layer besides the ring; rank 0's holds all four: both keep one.
        self.assertEqual([p["resident_layers"] for p in plans], [1, 1])
        self.assertEqual([p["streamed_layers"] for p in plans], [3, 3])
        for rank in self.ranks:
            self.assertEqual(rank["budgets"]["tokens"], self.expected["kv4"])

    def test_saved_contexts_per_rank(self):
        for rank in self.ranks:
            resumed = rank["resumed"]
            self.assertEqual(resumed["tokens"], self.expected["kv4"])
            self.assertEqual(resumed["length"], self.ids.shape[1] + NEW_TOKENS // 2 - 1)
            self.assertEqual(resumed["saved_tokens"], [self.expected["kv4"][:resumed["length"]]])
        files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.out, "*.kvo*")))
        # One file per rank where heads are sharded; one file in all for the replicated latents.
        self.assertEqual(files, ["context.kvo.rank0of2", "context.kvo.rank1of2", "latent.kvo"])
        for rank in self.ranks:
            self.assertEqual(rank["latent_resumed"]["tokens"], self.expected["deepseek_v3"])
        # One process cannot load it: the message names both world sizes.
        model = make_model(*MODELS["kv4"][:1], seed=3, **MODELS["kv4"][1])
        path = os.path.join(self.out, "context.kvo")
        with self.assertRaisesRegex(ValueError, "saved under tensor parallelism with a world size "
                                                "of 2 .* this is one process \\(world size 1\\)"):
            OffloadedStaticCache.load(path, model)
        # Nor can it read one rank's file under its own name: the heads differ.
        with self.assertRaisesRegex(ValueError, "was saved by rank 1 of a world size of 2, and "
                                                "this is one process"):
            OffloadedStaticCache.load(path + ".rank1of2", model)

    def test_a_rank_that_cannot_restore_stops_every_rank(self):
        self.assertRegex(self.ranks[1]["corrupted"]["refused"] or "",
                         "context.kvo.rank1of2: the block of layer 3 of 4 is corrupted")
        self.assertRegex(self.ranks[0]["corrupted"]["refused"] or "",
                         "rank 0: another tensor-parallel rank could not restore its saved "
                         "context")

    def test_refusals_name_why(self):
        for rank in self.ranks:
            # The refusal follows transformers, whose own forward fails on this model under two
            # ranks (it replicates no KV heads). Once it runs, the cache must learn replication.
            self.assertFalse(rank["kv1"]["transformers_ran"])
            self.assertRegex(rank["kv1"]["refused"] or "",
                             "1 KV heads and runs on 2 tensor-parallel ranks.*kv_heads < tp")
            self.assertRegex(rank["states"]["refused"] or "", "keeps fixed-size states")


if __name__ == "__main__":
    unittest.main()
