"""One rank of the tensor-parallel tests (test_hf_tp.py), run under
``torchrun --nproc-per-node 2`` on the CPU (gloo). It loads each tiny model the test saved with
``tp_plan="auto"``, generates with kvoffload's cache and writes what it saw, per rank, to
``<out>/rank<r>.json``: tokens, the cache's plan, the messages of refusals. The test compares.

    python -m torch.distributed.run --nproc-per-node 2 tp_worker.py MODELS_DIR OUT_DIR
"""

import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from kvoffload.hf import OffloadedStaticCache, TensorParallelError
from tiny_models import make_config

NEW_TOKENS = 32
MAX_CACHE_LEN = 48


def load(models, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(os.path.join(models, name), tp_plan="auto",
                                                    dtype=torch.float32).eval()


def prompt(models):
    return torch.tensor(json.load(open(os.path.join(models, "prompt.json"))))


def generate(model, cache, ids, new_tokens=NEW_TOKENS):
    return model.generate(ids, max_new_tokens=new_tokens, do_sample=False, cache=cache)[0].tolist()


def main(models, out):
    ids = prompt(models)
    seen = {}

    # Every layer streamed: the tokens, and what each rank allocated.
    for name in ("kv4", "kv2_gqa4", "gemma2", "deepseek_v3"):
        model = load(models, name)
        cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, resident_layers=0)
        seen[name] = {"tokens": generate(model, cache, ids), "plan": cache.plan(),
                      "h2d": cache.stats()["h2d_bytes_total"]}

    # Different budgets per rank: one plan, the smaller one.
    rank = dist.get_rank()  # transformers initialized torch.distributed when it loaded the model
    model = load(models, "kv4")
    plan = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                dtype=torch.float32).plan()
    budget = 1 << 30 if rank == 0 else plan["layer_bytes"] * 3 + plan["layer_bytes"] // 2
    cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                 dtype=torch.float32, vram_budget=budget)
    seen["budgets"] = {"tokens": generate(model, cache, ids), "plan": cache.plan(),
                       "budget": budget}

    # Saved contexts: half the tokens, saved; a fresh cache loads them and finishes.
    path = os.path.join(out, "context.kvo")
    first = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                 dtype=torch.float32, resident_layers=0)
    half = model.generate(ids, max_new_tokens=NEW_TOKENS // 2, do_sample=False, cache=first)
    first.save(path, tokens=half[0, :-1].tolist(), model=model)
    loaded = OffloadedStaticCache.load(path, model, resident_layers=0)
    seen["resumed"] = {"length": loaded.get_seq_length(), "saved_tokens": loaded.saved_tokens,
                       "tokens": generate(model, loaded, half, NEW_TOKENS - NEW_TOKENS // 2)}

    # One rank's file corrupted: that rank finds it only when it reads the rows, and every rank
    # raises (none goes on to wait for the other in the model's collectives).
    if rank == 1:
        with open(path + ".rank1of2", "r+b") as f:
            f.seek(-3, os.SEEK_END)
            f.write(b"xyz")
    dist.barrier()
    try:
        OffloadedStaticCache.load(path, model, resident_layers=0)
        seen["corrupted"] = {"refused": None}
    except (ValueError, RuntimeError) as error:
        seen["corrupted"] = {"refused": str(error)}

    # A replicated latent cache (DeepSeek V3): rank 0 writes one file, every rank loads it.
    model = load(models, "deepseek_v3")
    first = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                 dtype=torch.float32, resident_layers=0)
    half = model.generate(ids, max_new_tokens=NEW_TOKENS // 2, do_sample=False, cache=first)
    first.save(os.path.join(out, "latent.kvo"), model=model)
    loaded = OffloadedStaticCache.load(os.path.join(out, "latent.kvo"), model, resident_layers=0)
    seen["latent_resumed"] = {"tokens": generate(model, loaded, half,
                                                 NEW_TOKENS - NEW_TOKENS // 2)}

    # Refusals, the same on every rank: fewer KV heads than ranks; a model with states.
    model = load(models, "kv1")
    try:  # transformers itself cannot run it: it splits the one KV head over the ranks
        with torch.no_grad():
            model(ids)
        transformers_ran = True
    except RuntimeError:
        transformers_ran = False
    try:
        OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu", dtype=torch.float32)
        seen["kv1"] = {"refused": None}
    except TensorParallelError as error:
        seen["kv1"] = {"refused": str(error)}
    seen["kv1"]["transformers_ran"] = transformers_ran
    config = make_config("qwen3_next")
    config.distributed_config = model.config.distributed_config
    try:
        OffloadedStaticCache(config, 1, MAX_CACHE_LEN, device="cpu", dtype=torch.float32)
        seen["states"] = {"refused": None}
    except TensorParallelError as error:
        seen["states"] = {"refused": str(error)}

    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
