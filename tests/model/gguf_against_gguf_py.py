"""kvo-gguf reads what the gguf package (the format's Python implementation) writes and reads:
random files written by gguf.GGUFWriter (every metadata value type, arrays of strings, integers
and floats, tensors of every block type the decoder will serve, the default and a custom
alignment) and, when KVO_SMOLLM2_DIR holds it, the real SmolLM2-135M GGUF. Every key, type and
value, and every tensor's name, type, dimensions, offset and bytes, must equal gguf.GGUFReader's;
every tensor's dequantized elements (kvo-gguf --dequantize, model/checkpoint/ggml_blocks.hpp) must
equal gguf.quants.dequantize's bit for bit (random blocks: scales that are NaN must be NaN in
both). The model each file describes (kvo-gguf --config) must be the one transformers' GGUF loader
reads (AutoConfig.from_pretrained(..., gguf_file=...)): random Llama, Qwen2 and Qwen3 metadata and
SmolLM2's.

    python gguf_against_gguf_py.py KVO_GGUF WORK_DIR
"""

import json
import math
import os
import subprocess
import sys

import gguf
import numpy as np

BLOCK_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]


def ours(tool, path):
    out = subprocess.run([tool, "--model", path, "--json", "--arrays"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def same_number(a, b):
    if isinstance(a, str):  # non-finite floats, as kvo-gguf writes them
        return math.isnan(b) if a == "nan" else b == float(a)
    return a == b or (math.isfinite(b) and abs(a - b) <= 1e-12 * max(1.0, abs(b)))


dequantized = {}  # tensors compared bit for bit, by type


def check(tool, path, limit=None):
    reader = gguf.GGUFReader(path)
    got = ours(tool, path)
    problems = []
    # GGUF.version, GGUF.tensor_count and GGUF.kv_count are the reader's header fields.
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    if sorted(fields) != sorted(got["metadata"]):
        problems.append(f"keys differ: {sorted(set(fields) ^ set(got['metadata']))}")
    for key, field in fields.items():
        mine = got["metadata"].get(key)
        if mine is None:
            continue
        kind = field.types[0]
        if mine["type"] != kind.name.lower():
            problems.append(f"{key}: type {mine['type']} vs {kind.name}")
            continue
        value = field.contents()
        if kind == gguf.GGUFValueType.ARRAY:
            element = field.types[1]
            if mine["element"] != element.name.lower() or mine["count"] != len(value):
                problems.append(f"{key}: {mine['element']}[{mine['count']}] vs "
                                f"{element.name}[{len(value)}]")
            elif element in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
                if not all(same_number(a, float(b)) for a, b in zip(mine["value"], value)):
                    problems.append(f"{key}: float elements differ")
            elif element == gguf.GGUFValueType.BOOL:
                if [bool(v) for v in mine["value"]] != [bool(v) for v in value]:
                    problems.append(f"{key}: bool elements differ")
            elif element == gguf.GGUFValueType.STRING:
                if mine["value"] != value:
                    problems.append(f"{key}: string elements differ")
            elif mine["value"] != [int(v) for v in value]:
                problems.append(f"{key}: integer elements differ")
        elif kind in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
            if not same_number(mine["value"], float(value)):
                problems.append(f"{key}: {mine['value']} vs {value}")
        elif kind == gguf.GGUFValueType.BOOL:
            if mine["value"] != bool(value):
                problems.append(f"{key}: {mine['value']} vs {value}")
        elif kind == gguf.GGUFValueType.STRING:
            if mine["value"] != value:
                problems.append(f"{key}: {mine['value']!r} vs {value!r}")
        elif mine["value"] != int(value):
            problems.append(f"{key}: {mine['value']} vs {value}")
    for theirs in reader.tensors[:limit]:
        out = os.path.join(os.path.dirname(os.path.abspath(path)), "tensor.f32")
        subprocess.run([tool, "--model", path, "--dequantize", theirs.name, "--out", out],
                       check=True)
        mine = np.fromfile(out, dtype=np.float32)
        expected = gguf.quants.dequantize(theirs.data, theirs.tensor_type).astype(np.float32)
        expected = expected.reshape(-1)
        same = (mine.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(mine) &
                                                                     np.isnan(expected))
        if mine.size != expected.size or not same.all():
            problems.append(f"tensor {theirs.name} ({theirs.tensor_type.name}): "
                            f"{np.count_nonzero(~same) if mine.size == expected.size else 'size'}"
                            " elements differ from gguf.quants.dequantize")
        dequantized[theirs.tensor_type.name] = dequantized.get(theirs.tensor_type.name, 0) + 1
    if len(got["tensors"]) != len(reader.tensors):
        problems.append(f"{len(got['tensors'])} tensors vs {len(reader.tensors)}")
    for mine, theirs in zip(got["tensors"], reader.tensors):
        expected = {"name": theirs.name, "type": theirs.tensor_type.name,
                    "dims": [int(d) for d in theirs.shape], "bytes": int(theirs.n_bytes),
                    "at": int(theirs.data_offset)}
        actual = {"name": mine["name"], "type": mine["type"], "dims": mine["dims"],
                  "bytes": mine["bytes"], "at": got["data_offset"] + mine["offset"]}
        if actual != expected:
            problems.append(f"tensor {theirs.name}: {actual} vs {expected}")
    return problems, got


def random_file(path, seed, alignment):
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", int(rng.integers(0, 256)))
    writer.add_int8("t.i8", int(rng.integers(-128, 128)))
    writer.add_uint16("t.u16", int(rng.integers(0, 2**16)))
    writer.add_int16("t.i16", int(rng.integers(-2**15, 2**15)))
    writer.add_uint32("t.u32", int(rng.integers(0, 2**32)))
    writer.add_int32("t.i32", int(rng.integers(-2**31, 2**31)))
    writer.add_uint64("t.u64", int(rng.integers(0, 2**63)) * 2 + 1)
    writer.add_int64("t.i64", int(rng.integers(-2**63, 2**63)))
    writer.add_float32("t.f32", float(np.float32(rng.standard_normal() * 1e3)))
    writer.add_float64("t.f64", float(rng.standard_normal() * 1e-300))
    writer.add_bool("t.bool", bool(rng.integers(0, 2)))
    writer.add_string("t.text", "caf\u00e9 \u4e2d\u6587 " + str(rng.integers(0, 10**9)))
    writer.add_array("t.words", [f"w{i}\u00e9" for i in range(int(rng.integers(0, 50)))])
    writer.add_array("t.ints", [int(v) for v in rng.integers(-2**31, 2**31, 30)])
    writer.add_array("t.floats", [float(np.float32(v)) for v in rng.standard_normal(20)])
    writer.add_array("t.empty", [])
    for i, name in enumerate(BLOCK_TYPES):
        kind = gguf.GGMLQuantizationType[name]
        block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        rows = int(rng.integers(1, 4))
        columns = block * int(rng.integers(1, 3)) * (256 // block if block < 256 else 1)
        raw = rng.integers(0, 256, (rows, columns // block * block_bytes), dtype=np.uint8)
        writer.add_tensor(f"blk.{i}.{name.lower()}.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                 "vocab_size", "tie_word_embeddings")


def check_config(tool, path):
    """kvo-gguf --config against transformers' reading of the same metadata."""
    from transformers import AutoConfig

    mine = json.loads(subprocess.run([tool, "--model", path, "--config"], check=True,
                                     capture_output=True, text=True).stdout)
    theirs = AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    problems = []
    for field in CONFIG_FIELDS:
        expected = getattr(theirs, field, None)
        if field == "head_dim" and expected is None:  # Qwen2's class: hidden / heads
            expected = theirs.hidden_size // theirs.num_attention_heads
        got = mine.get(field, mine["hidden_size"] // mine["num_attention_heads"]
                       if field == "head_dim" else None)
        if got != expected:
            problems.append(f"--config {field}: {got} vs transformers' {expected}")
    rope_theta = (theirs.rope_parameters or {}).get("rope_theta")
    if mine["rope_theta"] != rope_theta:
        problems.append(f"--config rope_theta: {mine['rope_theta']} vs {rope_theta}")
    architecture = theirs.architectures[0] if theirs.architectures else {
        "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM"}[theirs.model_type]
    if mine["architectures"] != [architecture]:
        problems.append(f"--config architectures: {mine['architectures']} vs {architecture}")
    return problems


def config_file(path, arch, seed):
    """Metadata of a random model of `arch` as llama.cpp's converter writes it, and a vocabulary;
    an output matrix or not (tied embeddings)."""
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([4, 8, 16]))
    kv_heads = heads // int(rng.choice([1, 2, 4]))
    # transformers reads no head size from a Qwen3 file (its mapping drops key_length) and keeps
    # Qwen3's class default, 128, that of every released Qwen3: the random Qwen3 files use it.
    # kvo-gguf reads attention.key_length, as llama.cpp does.
    head_dim = 128 if arch == "qwen3" else int(rng.choice([32, 64, 128]))
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(int(rng.integers(1, 40)))
    writer.add_context_length(int(rng.choice([2048, 8192, 32768])))
    writer.add_embedding_length(heads * head_dim)
    writer.add_feed_forward_length(int(rng.integers(1, 20)) * 128)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if arch == "llama":
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(float(np.float32(10.0 ** -rng.integers(5, 7))))
    writer.add_rope_freq_base(float(rng.choice([10000.0, 500000.0, 1000000.0])))
    writer.add_tokenizer_model("gpt2")
    vocab = int(rng.integers(50, 300))
    writer.add_token_list([f"t{i}" for i in range(vocab)])
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(["t 1"])
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 32), dtype=np.float32))
    if rng.integers(0, 2):
        writer.add_tensor("output.weight", np.zeros((vocab, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    tool, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    failures = 0
    checked = 0
    for seed, alignment in ((1, None), (2, 64), (3, 256), (4, None)):
        path = os.path.join(work, f"random{seed}.gguf")
        random_file(path, seed, alignment)
        problems, got = check(tool, path)
        checked += 1
        if alignment is not None and got["alignment"] != alignment:
            problems.append(f"alignment {got['alignment']} vs {alignment}")
        for p in problems:
            print(f"{path}: {p}")
        failures += len(problems)
    for seed, arch in enumerate(("llama", "qwen2", "qwen3", "llama", "qwen2", "qwen3")):
        folder = os.path.join(work, f"config{seed}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "model.gguf")
        config_file(path, arch, seed)
        problems = check_config(tool, path)
        checked += 1
        for p in problems:
            print(f"{path} ({arch}): {p}")
        failures += len(problems)
    real = os.path.join(os.environ.get("KVO_SMOLLM2_DIR", ""), "model.gguf")
    if os.environ.get("KVO_SMOLLM2_DIR") and os.path.isfile(real):
        problems, got = check(tool, real, limit=40)  # the embedding (Q8_0) and 3 layers
        problems += check_config(tool, real)
        checked += 1
        types = sorted({t["type"] for t in got["tensors"]})
        print(f"{real}: {len(got['metadata'])} keys, {len(got['tensors'])} tensors ({types})")
        for p in problems:
            print(f"{real}: {p}")
        failures += len(problems)
    print(f"tensors dequantized bit for bit as gguf.quants.dequantize: {dequantized}")
    missing = [t for t in BLOCK_TYPES if t not in dequantized]
    if missing:
        print(f"no tensor of {missing} was dequantized")
        failures += 1
    print(f"{checked} GGUF files read as the gguf package reads them, {failures} difference(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
