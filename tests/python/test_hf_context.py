"""Saved contexts in the Python drop-in: a cache saved after the prompt and loaded into a new cache
(OffloadedStaticCache.load) continues a greedy generate with exactly the tokens of a cache that
never stopped; a context belongs to exactly one model, and a load under any other (a field of the
config that shapes the keys, other weights of the same shape, another tokenizer, other load
options, another K/V dtype) is refused naming the first field that differs and both values; a
corrupted file is refused naming the failing block. kvo-generate and the drop-in write the same
fingerprint for the same model, so a context kvo-generate saved loads into transformers."""

import copy
import os
import shutil
import subprocess
import tempfile
import unittest

import torch
from transformers import AutoModelForCausalLM

from kvoffload import _native, hf_fingerprint
from kvoffload.hf import OffloadedStaticCache
from tiny_models import make_model, prompts

MAX_CACHE_LEN = 48
HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(HERE, "..", "tools", "data", "tokenizer.json")
TOOLS = os.environ.get("KVO_TOOLS_DIR", "")


def fill(model, document, **kwargs):
    cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, dtype=torch.float32,
                                 resident_layers=0, **kwargs)
    with torch.no_grad():
        model(document, cache=cache, use_cache=True)
    return cache


def variant(model, change):
    """`model`'s weights under a config changed by `change` (biases it adds stay zero)."""
    config = copy.deepcopy(model.config)
    change(config)
    torch.manual_seed(0)
    other = type(model)(config).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    other.load_state_dict(model.state_dict(), strict=False)
    return other


class SavedContext(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "context.kvo")

    def tearDown(self):
        self.dir.cleanup()

    def test_load_continues_like_one_generate(self):
        model = make_model("llama3")
        document, _ = prompts(1, 20, seed=3)
        question, _ = prompts(1, 6, seed=4)
        whole = torch.cat([document, question], dim=1)

        once = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, dtype=model.dtype,
                                    resident_layers=1)
        expected = model.generate(whole, max_new_tokens=8, do_sample=False, cache=once)

        saved = fill(model, document)
        saved.save(self.path, tokens=document[0].tolist(), model=model)

        loaded = OffloadedStaticCache.load(self.path, model, resident_layers=2)
        self.assertEqual(loaded.get_seq_length(), document.shape[1])
        self.assertEqual(loaded.saved_tokens, [document[0].tolist()])
        got = model.generate(whole, max_new_tokens=8, do_sample=False, cache=loaded)
        self.assertEqual(got.tolist(), expected.tolist())

    def test_refusals(self):
        model = make_model("llama3")
        document, _ = prompts(1, 10, seed=5)
        fill(model, document).save(self.path, model=model)

        other = make_model("qwen2")
        with self.assertRaisesRegex(ValueError, "saved from a cache with|saved for another model"):
            OffloadedStaticCache.load(self.path, other)
        with self.assertRaisesRegex(ValueError, "K/V dtype f32, this one has K/V dtype bf16"):
            OffloadedStaticCache.load(self.path, model, dtype=torch.bfloat16)
        with self.assertRaisesRegex(TypeError, "load needs the model .* got LlamaConfig"):
            OffloadedStaticCache.load(self.path, model.config)

        with open(self.path, "rb") as f:
            data = bytearray(f.read())
        data[len(data) - 20] ^= 0x40  # in the last layer's V rows
        with open(self.path, "wb") as f:
            f.write(data)
        layers = model.config.num_hidden_layers
        with self.assertRaisesRegex(ValueError, f"the block of layer {layers - 1} of {layers} is "
                                                "corrupted"):
            OffloadedStaticCache.load(self.path, model)

    def test_a_context_belongs_to_one_model(self):
        """Each field that shapes the keys, changed alone over the same weights, is named with
        both values; so are other weights, another tokenizer and other load options."""
        model = make_model("llama3")
        document, _ = prompts(1, 10, seed=6)
        tokenizer = os.path.join(self.dir.name, "tokenizer")
        os.makedirs(tokenizer)
        shutil.copy(TOKENIZER, tokenizer)
        fill(model, document).save(self.path, model=model, tokenizer=tokenizer)
        OffloadedStaticCache.load(self.path, model, tokenizer=tokenizer)  # its own model: loads

        def rope(**values):
            def change(config):
                config.rope_parameters = {**config.rope_parameters, **values}
            return change

        def field(name, value):
            return lambda config: setattr(config, name, value)

        cases = [
            (rope(rope_theta=500001.0), "config.rope_parameters.rope_theta is 500000 in the file "
                                        "and 500001 here"),
            (rope(factor=4.0), "config.rope_parameters.factor is 8 in the file and 4 here"),
            (rope(low_freq_factor=2.0), "config.rope_parameters.low_freq_factor is 1 in the "
                                        "file and 2 here"),
            (rope(high_freq_factor=5.0), "config.rope_parameters.high_freq_factor is 4 in the "
                                         "file and 5 here"),
            (rope(original_max_position_embeddings=32), "config.rope_parameters."
             "original_max_position_embeddings is 16 in the file and 32 here"),
            (lambda c: setattr(c, "rope_parameters", {"rope_type": "linear", "factor": 8.0,
                                                      "rope_theta": 500000.0}),
             "config.rope_parameters.high_freq_factor is 4 in the file and absent here"),
            (field("max_position_embeddings", 8), "config.max_position_embeddings is 256 in the "
                                                  "file and 8 here"),
            (field("rms_norm_eps", 1.0000004e-06), "config.rms_norm_eps is 1e-06 in the file and "
                                                   "1.0000004e-06 here"),
            (field("attention_bias", True), "config.attention_bias is absent in the file and "
                                            "true here"),
            (field("mlp_bias", True), "config.mlp_bias is absent in the file and true here"),
            (field("hidden_act", "gelu"), "config.hidden_act is silu in the file and gelu here"),
            (field("tie_word_embeddings", True), "config.tie_word_embeddings is absent in the "
                                                 "file and true here"),
        ]
        for change, message in cases:
            with self.subTest(message), self.assertRaises(ValueError) as raised:
                OffloadedStaticCache.load(self.path, variant(model, change), tokenizer=tokenizer)
            self.assertIn(f"saved for another model: {message}; nothing was loaded",
                          str(raised.exception))

        # Head sizes (other weights too): the cache's own shape check names them first.
        with self.assertRaisesRegex(ValueError, "head_dim 16, this one has head_dim 32"):
            OffloadedStaticCache.load(self.path, make_model("llama3", head_dim=32))
        # Other weights of the same config: one value changed.
        other = copy.deepcopy(model)
        with torch.no_grad():
            other.model.layers[1].mlp.down_proj.weight[3, 5] += 1
        with self.assertRaisesRegex(ValueError, "saved for another model: weights.xxh3 is "
                                                "[0-9a-f]{32} in the file and [0-9a-f]{32} here"):
            OffloadedStaticCache.load(self.path, other, tokenizer=tokenizer)
        # Other load options: the model computing in bf16 over the same f32 keys.
        with self.assertRaisesRegex(ValueError, "load.activations is f32 in the file and bf16 "
                                                "here"):
            OffloadedStaticCache.load(self.path, copy.deepcopy(model).to(torch.bfloat16),
                                      dtype=torch.float32, tokenizer=tokenizer)
        # Another tokenizer, or none.
        with open(os.path.join(tokenizer, "tokenizer.json"), "a") as f:
            f.write("\n")
        with self.assertRaisesRegex(ValueError, "tokenizer.xxh3 is [0-9a-f]{32} in the file and "
                                                "[0-9a-f]{32} here"):
            OffloadedStaticCache.load(self.path, model, tokenizer=tokenizer)
        with self.assertRaisesRegex(ValueError, "tokenizer.xxh3 is [0-9a-f]{32} in the file and "
                                                "absent here"):
            OffloadedStaticCache.load(self.path, model)

    def test_the_digest_is_taken_once_per_model(self):
        model = make_model("llama3")
        first = hf_fingerprint.weights_digest(model)
        kept = model._kvoffload_weights_digest
        self.assertEqual(hf_fingerprint.weights_digest(model), first)
        self.assertIs(model._kvoffload_weights_digest, kept)  # not taken again
        with torch.no_grad():  # an in-place change: taken again
            model.model.norm.weight.mul_(2)
        self.assertNotEqual(hf_fingerprint.weights_digest(model), first)
        with torch.no_grad():
            model.model.norm.weight.div_(2)
        self.assertEqual(hf_fingerprint.weights_digest(model), first)

    def test_more_token_lists_than_rows_are_refused(self):
        model = make_model("llama3")
        document, _ = prompts(1, 6, seed=7)
        cache = fill(model, document)
        with self.assertRaisesRegex(ValueError, "tokens holds 2 lists of ids, and the cache has 1 "
                                                "row\\(s\\); nothing was saved"):
            cache.save(self.path, tokens=[[1, 2], [3, 4]], model=model)
        self.assertFalse(os.path.exists(self.path))
        with self.assertRaisesRegex(TypeError, "save needs the model"):
            cache.save(self.path, model=model.config)


@unittest.skipUnless(TOOLS, "KVO_TOOLS_DIR names the folder of kvo-make-model and kvo-generate")
class SameFingerprintAsKvoGenerate(unittest.TestCase):
    """The drop-in and kvo-generate state the same facts of one model in the same bytes: a field
    either writer left out, or wrote another way, fails the comparison of the whole texts."""

    ARCHS = [("llama", ["--rope", "llama3", "--rope-factor", "8", "--rope-original", "16"]),
             ("llama", ["--rope", "yarn", "--rope-original", "32"]),
             ("mistral", ["--window", "16"]),
             ("qwen2", []),
             ("qwen3", ["--rope", "linear"]),
             ("phi3", ["--rope", "longrope", "--rope-original", "32"]),
             ("gemma2", ["--window", "8"]),
             ("gemma3_text", ["--window", "8", "--rope", "linear"])]

    def test_every_family(self):
        for arch, extra in self.ARCHS:
            with self.subTest(arch=arch, extra=extra), tempfile.TemporaryDirectory() as out:
                self.check(arch, extra, out)

    def check(self, arch, extra, out):
        model_dir = os.path.join(out, "model")
        vocab = "32064" if arch == "phi3" else "300"  # past Phi-3's pad_token_id, 32000
        subprocess.run([os.path.join(TOOLS, "kvo-make-model"), "--arch", arch, "--layers", "2",
                        "--hidden", "64", "--intermediate", "96", "--heads", "4", "--kv-heads",
                        "2", "--head-dim", "16", "--vocab", vocab, "--dtype", "f32", "--out",
                        model_dir, *extra], check=True, capture_output=True)
        shutil.copy(TOKENIZER, model_dir)
        context = os.path.join(out, "context.kvo")
        run = subprocess.run([os.path.join(TOOLS, "kvo-generate"), "--backend", "host",
                              "--model", model_dir, "--window-layers", "full", "--prompt",
                              "the cat sat on the mat", "--max-new", "0", "--save-context",
                              context], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        theirs = _native.inspect_saved_context(context)["models"][0]

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        cache = OffloadedStaticCache(model.config, 1, 32, dtype=torch.float32)
        mine = hf_fingerprint.model_fingerprint(model, cache.head_dim, cache.shard,
                                                tokenizer=model_dir)
        self.assertEqual(mine, theirs)
        if "--window" in extra:
            return  # the drop-in keeps windows on the device, which a saved context does not hold
        # The context loads into transformers' model, and continues as transformers alone does.
        loaded = OffloadedStaticCache.load(context, model, tokenizer=model_dir)
        prompt = loaded.saved_tokens[0]
        self.assertEqual(len(prompt), loaded.get_seq_length())
        ids = torch.tensor([prompt + [31]])
        fresh = OffloadedStaticCache(model.config, 1, 32, dtype=torch.float32)
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, cache=fresh)
        got = model.generate(ids, max_new_tokens=6, do_sample=False, cache=loaded)
        self.assertEqual(got.tolist(), expected.tolist())


if __name__ == "__main__":
    unittest.main()
