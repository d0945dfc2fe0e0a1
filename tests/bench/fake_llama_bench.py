#!/usr/bin/env python3
"""Stands in for llama.cpp's llama-bench in the smoke test of bench/gguf_vs_llama_cpp.py: reads
the same -p, -n and -d lists and prints one JSON record per test, as llama-bench -o json does,
with made-up rates."""
import json
import sys


def values(flag):
    args = sys.argv[1:]
    return [int(v) for v in args[args.index(flag) + 1].split(",")] if flag in args else [0]


tests = []
for n_prompt in values("-p"):
    for n_gen in values("-n"):
        for depth in values("-d"):
            if n_prompt == 0 and n_gen == 0:
                continue
            tests.append({"build_commit": "fake", "build_number": 0, "cpu_info": "fake",
                          "backends": "CPU", "model_type": "fake", "model_size": 0,
                          "n_threads": 1, "n_prompt": n_prompt, "n_gen": n_gen,
                          "n_depth": depth, "avg_ts": 100.0 + n_prompt + depth})
print(json.dumps(tests))
