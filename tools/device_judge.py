#!/usr/bin/env python3
"""Judges a run of tools/device-check.sh: reads what its steps wrote into the work directory
(steps.tsv, env.json, the benchmarks' and tests' JSON, the tools' --json lines), turns them into
figures, and holds every figure to its band in a bands file (bench/results/expected-h200.md for
the GPU, bench/results/expected-small.md for `--small`). Writes
device-check.json (every figure, band, verdict, step, test count and the machine) and summary.md
(PASS, FAIL or SKIPPED per line, measured beside expected) into the output directory.

A bands table has the columns | key | step | figure | expected | min | max | unit | model |.
A figure inside [min, max] passes, outside fails; a figure not measured is SKIPPED when its step
was skipped for time (or left out with --only), and fails otherwise. A figure drawn from several
steps names them all (`decode+decode_int8`) and is skipped when any of them was. Exit status 1 when anything
failed: a step (a test, a benchmark that threw, a byte-model mismatch, a binary that was missing)
or a figure; else 3 when something was skipped (the headline says INCOMPLETE, never PASS); else
0.

    device_judge.py --work DIR --bands FILE --out DIR [--set KEY=VALUE ...]

--set replaces a measured figure (to test the judge itself: a figure forced out of its band must
fail the run).
"""
import argparse
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def last_json_line(path):
    """The last line of a tool's log that parses as a JSON object (its --json line)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def write(path, text):
    """`text` into `path` whole or not at all: a run killed while the judge writes (the check
    judges after every step) leaves the previous file."""
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def k_of(tokens):
    return f"{int(tokens) // 1024}k"


def benchmarks(doc):
    return doc.get("benchmarks", []) if isinstance(doc, dict) else []


def medians(entries):
    """Benchmarks run with --benchmark_repetitions: each one's median aggregate alone (its
    counters are the medians of the repetitions'); otherwise every entry."""
    if any(e.get("run_type") == "aggregate" for e in entries):
        return [e for e in entries if e.get("aggregate_name") == "median"]
    return entries


def read_steps(work):
    steps = []
    try:
        with open(os.path.join(work, "steps.tsv")) as f:
            for line in f:
                name, status, seconds, note = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
                steps.append({"step": name, "status": status, "seconds": float(seconds or 0),
                              "note": note})
    except OSError:
        pass
    return steps


def bench_errors(doc):
    """Benchmarks that threw or skipped with an error: (name, message)."""
    return [(b.get("name", "?"), b.get("error_message", "error"))
            for b in benchmarks(doc) if b.get("error_occurred")]


def figures(work):
    """Every figure the run's files hold, by key, and the problems found in them, each as (the
    step that wrote the file, what is wrong)."""
    m, problems = {}, []
    for name in ("bandwidth",):
        for b in benchmarks(load(os.path.join(work, f"{name}.json"))):
            if b["name"].startswith("BM_Copy/H2D/") and not b.get("error_occurred"):
                m["h2d_GBps"] = max(m.get("h2d_GBps", 0), b.get("bytes_per_second", 0) / 1e9)
    for name, prefix in (("attention", ""), ("attention_int8", "int8_")):
        doc = load(os.path.join(work, f"{name}.json"))
        for bench, message in bench_errors(doc):
            problems.append((name, f"{name}: {bench} threw: {message}"))
        for b in benchmarks(doc):
            if b.get("error_occurred"):
                continue
            n = b["name"]
            if n.startswith("BM_HbmCopy") and not prefix:
                m["hbm_TBps"] = b["hbm_bytes_per_s"] / 1e12
            elif n.startswith("BM_GemmBf16") and not prefix:
                m["gemm_TFLOPs"] = b["flop_per_s"] / 1e12
            elif n.startswith("BM_GgufDecodeQ4K") and not prefix:
                m["gguf_q4k_decode_layer_us"] = b["layer_s"] * 1e6
                if "hbm_fraction" in b:
                    m["gguf_q4k_decode_hbm_fraction"] = b["hbm_fraction"]
            elif n.startswith("BM_DecodeAttention"):
                k = k_of(b["context"])
                m[f"{prefix}decode_attn_{k}_us"] = b["time_s"] * 1e6
                if "hbm_fraction" in b:
                    m[f"{prefix}decode_attn_{k}_hbm_fraction"] = b["hbm_fraction"]
            elif n.startswith("BM_PrefillAttention"):
                k = k_of(b["prefix"])
                m[f"{prefix}prefill_attn_{k}_ms"] = b["time_s"] * 1e3
                if "gemm_fraction" in b:
                    m[f"{prefix}prefill_attn_{k}_gemm_fraction"] = b["gemm_fraction"]
    for name, prefix, step in (("decode_compare", "", "decode"),
                               ("decode_compare_int8", "int8_", "decode_int8")):
        doc = load(os.path.join(work, f"{name}.json"))
        for bench, message in bench_errors(doc):
            problems.append((step, f"{name}: {bench} threw: {message}"))
        for b in medians(benchmarks(doc)):
            if b.get("error_occurred") or "step_s" not in b:
                continue
            kind, k = b["name"].split("/")[1], k_of(b["context"])
            if kind == "kvoffload":
                m[f"{prefix}decode_streamed_{k}_ms"] = b["step_s"] * 1e3
                m[f"{prefix}step_floor_{k}_ms"] = b["floor_s"] * 1e3
                m[f"{prefix}decode_streamed_{k}_efficiency"] = b["efficiency"]
            elif kind == "hf_like" and not prefix:
                m[f"hf_like_{k}_ms"] = b["step_s"] * 1e3
            elif kind == "all_resident" and not prefix:
                m[f"all_resident_{k}_ms"] = b["step_s"] * 1e3
    # The transformers-like cache against ours, and int8 against bf16, every layer streamed: the
    # same run's step times, as ratios.
    for key in list(m):
        hit = re.fullmatch(r"hf_like_(\d+k)_ms", key)
        if hit and f"decode_streamed_{hit.group(1)}_ms" in m:
            m[f"hf_like_over_kvoffload_{hit.group(1)}"] = (
                m[key] / m[f"decode_streamed_{hit.group(1)}_ms"])
    for key in list(m):
        hit = re.fullmatch(r"int8_decode_streamed_(\d+k)_ms", key)
        if hit and f"decode_streamed_{hit.group(1)}_ms" in m:
            m[f"int8_decode_speedup_{hit.group(1)}"] = (
                m[f"decode_streamed_{hit.group(1)}_ms"] / m[key])
    for path in sorted(glob.glob(os.path.join(work, "replay_*.log"))):
        r = last_json_line(path)
        k = k_of(os.path.basename(path)[7:-4])
        if r is None:
            problems.append(("replay", f"{os.path.basename(path)}: no JSON line"))
            continue
        m[f"replay_{k}_h2d_bytes"] = r.get("h2d_bytes_last_step", 0)
        if r.get("verified") is not True:
            problems.append(("replay", f"kvo-replay at {k}: rows not verified"))
    for path in sorted(glob.glob(os.path.join(work, "generate_*.log"))):
        g = last_json_line(path)
        name = os.path.basename(path)[9:-4]  # e.g. 32768 or prefill_131072_int8
        if g is None or "prefill_tokens_per_s" not in g:
            continue
        parts = name.split("_")
        if parts[0] == "prefill":
            suffix = f"_{parts[2]}" if len(parts) > 2 else ""
            m[f"prefill_{k_of(parts[1])}{suffix}_s"] = g["prefill_s"]
        else:
            m[f"generate_{k_of(parts[0])}_prefill_tok_s"] = g["prefill_tokens_per_s"]
            m[f"generate_{k_of(parts[0])}_decode_tok_s"] = g["decode_tokens_per_s"]
            m[f"generate_{k_of(parts[0])}_peak_device_GiB"] = g["peak_device_bytes"] / 2**30
    # Split attention: the same decode with --split off and --split auto, and the model of the
    # split from the rates the auto run measured: (h2d + host) / h2d.
    for path in sorted(glob.glob(os.path.join(work, "split_auto_*.log"))):
        ctx = os.path.basename(path)[len("split_auto_"):-4]
        on, off = last_json_line(path), last_json_line(os.path.join(work, f"split_off_{ctx}.log"))
        if not on or not off or not on.get("decode_tokens_per_s") or not off.get(
                "decode_tokens_per_s"):
            problems.append(("split", f"split at {ctx}: a run gave no decode figure"))
            continue
        k = k_of(ctx)
        speedup = on["decode_tokens_per_s"] / off["decode_tokens_per_s"]
        m[f"split_decode_{k}_speedup"] = speedup
        h2d, host = on.get("split_h2d_bytes_per_s", 0), on.get("split_host_bytes_per_s", 0)
        if h2d > 0 and host > 0:
            m[f"split_decode_{k}_model_fraction"] = speedup / ((h2d + host) / h2d)
    return m, problems


def read_bands(path):
    bands = []
    with open(path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 8 or cells[0] == "key" or not re.fullmatch(r"[A-Za-z0-9_]+", cells[0]):
                continue
            key, step, figure, expected, lo, hi, unit, model = cells
            bands.append({"key": key, "step": step, "figure": figure, "expected": float(expected),
                          "min": float(lo), "max": float(hi), "unit": unit, "model": model})
    return bands


def step_of(names, status_of):
    """The status of a band's step; a figure drawn from several steps (`decode+decode_int8`)
    takes the worst of them: FAIL before a skip that names a missing binary, before SKIPPED."""
    found = [status_of.get(n, {"step": n, "status": "SKIPPED", "note": "not run"})
             for n in names.split("+")]
    for s in found:
        if s["status"] == "FAIL":
            return s
    for s in found:
        if s["status"] == "SKIPPED" and "missing" in s.get("note", ""):
            return s
    for s in found:
        if s["status"] == "SKIPPED":
            return dict(s, note=f"{s.get('step', '?')}: {s.get('note', '')}")
    return found[0]


def skipped_for_time(step):
    """Whether a step (None: not in steps.tsv) was skipped or cut for time, or left out."""
    return step is None or (step["status"] == "SKIPPED" and "missing" not in step.get("note", ""))


def tests(work):
    out = {}
    for path in sorted(glob.glob(os.path.join(work, "tests_*.json"))):
        doc = load(path) or {}
        out[os.path.basename(path)[6:-5]] = {k: doc.get(k) for k in ("tests", "failures", "errors",
                                                                       "disabled")}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--bands", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    measured, found = figures(args.work)
    for item in args.set:
        key, value = item.split("=", 1)
        measured[key] = float(value)
    steps = read_steps(args.work)
    status_of = {s["step"]: s for s in steps}
    # What a step cut by the deadline (or not yet run, in a run still going or killed) left
    # behind is partial, not wrong: its figures are SKIPPED with the step, not failed.
    problems = [what for step, what in found if not skipped_for_time(status_of.get(step))]
    env = load(os.path.join(args.work, "env.json")) or {}
    verdicts = []
    for b in read_bands(args.bands):
        v = measured.get(b["key"])
        step = step_of(b["step"], status_of)
        if v is not None:
            verdict = "PASS" if b["min"] <= v <= b["max"] else "FAIL"
            why = "" if verdict == "PASS" else f"outside [{b['min']:g}, {b['max']:g}]"
        elif step["status"] == "SKIPPED" and "missing" not in step.get("note", ""):
            verdict, why = "SKIPPED", f"step {b['step']} skipped: {step.get('note', '')}"
        else:
            verdict, why = "FAIL", f"not measured (step {b['step']}: {step['status']})"
        verdicts.append(dict(b, measured=v, verdict=verdict, why=why))

    failed_steps = [s for s in steps if s["status"] == "FAIL" or
                    (s["status"] == "SKIPPED" and "missing" in s["note"])]
    failed_figures = [v for v in verdicts if v["verdict"] == "FAIL"]
    ok = not failed_steps and not failed_figures and not problems
    skipped = [v for v in verdicts if v["verdict"] == "SKIPPED"] + [
        s for s in steps if s["status"] == "SKIPPED"]
    headline = "FAIL" if not ok else "INCOMPLETE" if skipped else "PASS"
    report = {
        "commit": env.get("commit"), "date": env.get("date"), "machine": env,
        "verdict": headline, "steps": steps, "tests": tests(args.work), "problems": problems,
        "figures": verdicts,
        "measured_without_band": {k: v for k, v in sorted(measured.items())
                                  if k not in {b["key"] for b in verdicts}},
    }
    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "device-check.json"), json.dumps(report, indent=1))

    counted = {x: sum(v["verdict"] == x for v in verdicts) for x in ("PASS", "FAIL", "SKIPPED")}
    lines = [f"# device-check: {headline}", "",
             f"{counted['PASS']} figures within their bands, {counted['FAIL']} not, "
             f"{counted['SKIPPED']} skipped; {len(failed_steps)} steps failed.", "",
             f"commit {env.get('commit', '?')}, {env.get('date', '?')}; "
             f"GPU {env.get('gpu') or 'none'} (driver {env.get('driver') or 'none'}, "
             f"PCIe gen {env.get('pcie_gen') or '?'} x{env.get('pcie_width') or '?'}); "
             f"{env.get('cpus', '?')} CPUs, MemTotal {env.get('mem_total_gib', '?')} GiB, "
             f"MemAvailable {env.get('mem_available_gib', '?')} GiB; backend "
             f"{env.get('backend', '?')}{', small' if env.get('small') else ''}; "
             f"{env.get('elapsed_s', '?')} s of a {env.get('deadline_s', '?')} s deadline.", "",
             "| step | verdict | seconds | note |", "| --- | --- | ---: | --- |"]
    for s in steps:
        verdict = "FAIL" if s in failed_steps else s["status"]
        lines.append(f"| {s['step']} | {verdict} | {s['seconds']:.0f} | {s['note']} |")
    lines += ["", "| tests | run | failed |", "| --- | ---: | ---: |"]
    for name, t in report["tests"].items():
        lines.append(f"| {name} | {t['tests']} | {(t['failures'] or 0) + (t['errors'] or 0)} |")
    lines += ["", "| figure | verdict | measured | expected | band | unit |",
              "| --- | --- | ---: | ---: | --- | --- |"]
    def num(x):  # exact counts in full, the rest to 4 digits
        return str(int(x)) if float(x).is_integer() and abs(x) >= 1e4 else f"{x:.4g}"
    for v in verdicts:
        shown = "" if v["measured"] is None else num(v["measured"])
        lines.append(f"| {v['figure']} (`{v['key']}`) | {v['verdict']} | {shown} | "
                     f"{num(v['expected'])} | [{num(v['min'])}, {num(v['max'])}] | {v['unit']} |")
    if problems:
        lines += ["", "Problems:"] + [f"- {x}" for x in problems]
    text = "\n".join(lines) + "\n"
    write(os.path.join(args.out, "summary.md"), text)
    sys.stdout.write(text)
    return 1 if headline == "FAIL" else 3 if headline == "INCOMPLETE" else 0


if __name__ == "__main__":
    sys.exit(main())
