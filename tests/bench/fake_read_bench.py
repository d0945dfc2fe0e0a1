#!/usr/bin/env python3
"""Stands in for kvo_bench_host_attention in the smoke test of bench/gguf_vs_llama_cpp.py
--read-bench: prints Google Benchmark's JSON with one iteration record per repetition, each with
a made-up read_bytes_per_second, as the benchmark does with --benchmark_format=json."""
import json
import sys

repetitions = next((int(a.split("=", 1)[1]) for a in sys.argv[1:]
                    if a.startswith("--benchmark_repetitions=")), 1)
runs = [{"name": "BM_HostDecodeAttention/fake", "run_type": "iteration",
         "read_bytes_per_second": 1.0e10 + 1.0e9 * i} for i in range(repetitions)]
print(json.dumps({"context": {"fake": True}, "benchmarks": runs}))
