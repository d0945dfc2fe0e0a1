"""The FFI promise, kept from Python's ctypes alone (no torch, no build of ours): load the installed
libkvoffload.so, run a prefill and decode steps on the host backend, check every view through its
strides, and provoke each status code the library can return here.

    python3 ctypes_test.py PATH/TO/libkvoffload.so.0
"""
import ctypes as C
import random
import struct
import sys

KVO_OK, INVALID, PROTOCOL, OOM, DEVICE, INTERNAL = range(6)
F32, F16, BF16 = range(3)
AUTO, CUDA, HOST = range(3)


class Options(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("layers", C.c_int32), ("kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("max_seq", C.c_int32), ("slots", C.c_int32),
                ("dtype", C.c_int), ("resident_layers", C.c_int32), ("ring_depth", C.c_int32),
                ("device_budget", C.c_uint64), ("backend", C.c_int), ("device", C.c_int32),
                ("host_max_delay_us", C.c_uint32), ("host_delay_seed", C.c_uint64),
                ("v_head_dim", C.c_int32)]


class View(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("layer", C.c_int32), ("resident", C.c_int32),
                ("k", C.c_void_p), ("v", C.c_void_p), ("slot_stride", C.c_int64),
                ("token_stride", C.c_int64), ("head_stride", C.c_int64), ("slots", C.c_int32),
                ("max_seq", C.c_int32), ("kv_heads", C.c_int32), ("head_dim", C.c_int32),
                ("dtype", C.c_int), ("lengths", C.POINTER(C.c_int32)),
                ("new_tokens", C.POINTER(C.c_int32)), ("v_slot_stride", C.c_int64),
                ("v_token_stride", C.c_int64), ("v_head_stride", C.c_int64),
                ("v_head_dim", C.c_int32)]


class Stats(C.Structure):
    _fields_ = [("struct_size", C.c_uint32)] + [(n, C.c_uint64) for n in (
        "steps", "h2d_bytes_total", "d2h_bytes_total", "h2d_bytes_last_step",
        "d2h_bytes_last_step")] + [("acquire_wait_s", C.c_double)] + [(n, C.c_uint64) for n in (
        "prefetch_reissues", "device_allocations")] + [(n, C.c_int32) for n in (
        "resident_layers", "streamed_layers", "ring_depth")] + [(n, C.c_uint64) for n in (
        "row_bytes", "layer_bytes", "resident_bytes", "staging_bytes", "device_bytes",
        "host_bytes", "budget", "v_row_bytes")]


LAYERS, KV_HEADS, HEAD_DIM, MAX_SEQ, SLOTS, RESIDENT = 5, 2, 4, 40, 2, 1
ROW = KV_HEADS * HEAD_DIM
checks = failures = 0


def check(condition, what):
    global checks, failures
    checks += 1
    if not condition:
        failures += 1
        print("FAILED:", what)


def value(layer, kv, slot, token, i):
    return float(layer * 10000 + kv * 5000 + slot * 1000 + token * 10 + i)


def main():
    lib = C.CDLL(sys.argv[1])
    lib.kvo_version.restype = C.c_char_p
    lib.kvo_last_error.restype = C.c_char_p
    lib.kvo_status_name.restype = C.c_char_p
    lib.kvo_cache_create.argtypes = [C.POINTER(Options), C.POINTER(C.c_void_p)]
    for name in ("kvo_begin_step", "kvo_acquire", "kvo_append", "kvo_release", "kvo_end_step",
                 "kvo_stats", "kvo_reset_slot", "kvo_length", "kvo_last_error",
                 "kvo_cache_destroy", "kvo_abort_step"):
        getattr(lib, name).argtypes = None
    print("libkvoffload", lib.kvo_version().decode())

    options = Options()
    check(lib.kvo_cache_options_init(C.byref(options), C.sizeof(options)) == KVO_OK, "init")
    check(options.layers == 32 and options.head_dim == 128 and options.v_head_dim == 0, "defaults")
    options.layers, options.kv_heads, options.head_dim = LAYERS, KV_HEADS, HEAD_DIM
    options.max_seq, options.slots, options.dtype = MAX_SEQ, SLOTS, F32
    options.resident_layers, options.backend = RESIDENT, HOST
    options.host_max_delay_us, options.host_delay_seed = 50, 7  # copies late, at random
    cache = C.c_void_p()
    check(lib.kvo_cache_create(C.byref(options), C.byref(cache)) == KVO_OK, "create")

    rng = random.Random(11)
    lengths = [0] * SLOTS
    views = 0
    for step in range(12):
        n = [9, 4] if step == 0 else [rng.choice([0, 1, 1, 2]) for _ in range(SLOTS)]
        counts = (C.c_int32 * SLOTS)(*n)
        check(lib.kvo_begin_step(cache, counts, SLOTS) == KVO_OK, "begin_step")
        for layer in range(LAYERS):
            view = View()
            view.struct_size = C.sizeof(view)
            check(lib.kvo_acquire(cache, layer, C.byref(view), None) == KVO_OK, "acquire")
            check(view.layer == layer and view.resident == (layer < RESIDENT), "view layer")
            check(view.head_stride == HEAD_DIM and view.token_stride == ROW and
                  view.slot_stride == MAX_SEQ * ROW, "view strides")
            check(view.v_token_stride == ROW and view.v_head_dim == HEAD_DIM, "view V strides")
            rows = {}
            for s in range(SLOTS):
                for kv in (0, 1):
                    data = [value(layer, kv, s, lengths[s] + t, i)
                            for t in range(n[s]) for i in range(ROW)]
                    rows[(s, kv)] = (C.c_float * max(1, len(data)))(*data)
                check(lib.kvo_append(cache, layer, s, rows[(s, 0)], rows[(s, 1)], n[s], None)
                      == KVO_OK, "append")
            # Every row, old and new, read through the view's strides: element (s, t, h, d) of
            # K at k + (s * slot_stride + t * token_stride + h * head_stride + d) * 4 bytes.
            for s in range(SLOTS):
                check(view.lengths[s] == lengths[s] and view.new_tokens[s] == n[s], "lengths")
                for t in range(lengths[s] + n[s]):
                    for kv, base, (ss, ts, hs) in (
                            (0, view.k, (view.slot_stride, view.token_stride, view.head_stride)),
                            (1, view.v, (view.v_slot_stride, view.v_token_stride,
                                         view.v_head_stride))):
                        for h in range(KV_HEADS):
                            at = base + (s * ss + t * ts + h * hs) * 4
                            got = struct.unpack("%df" % HEAD_DIM, C.string_at(at, HEAD_DIM * 4))
                            want = tuple(value(layer, kv, s, t, h * HEAD_DIM + d)
                                         for d in range(HEAD_DIM))
                            check(got == want, f"step {step} layer {layer} slot {s} token {t}")
            views += 1
            check(lib.kvo_release(cache, layer, None) == KVO_OK, "release")
        check(lib.kvo_end_step(cache) == KVO_OK, "end_step")
        prefix = sum(lengths)
        lengths = [a + b for a, b in zip(lengths, n)]
        stats = Stats()
        stats.struct_size = C.sizeof(stats)
        check(lib.kvo_stats(cache, C.byref(stats)) == KVO_OK, "stats")
        streamed = LAYERS - RESIDENT
        check(stats.h2d_bytes_last_step == streamed * 2 * prefix * ROW * 4,
              f"H2D bytes of step {step}: {stats.h2d_bytes_last_step}")
        check(stats.d2h_bytes_last_step == streamed * 2 * sum(n) * ROW * 4, "D2H bytes")

    def expect(status, code, words):
        check(status == code, f"status {status}, expected {code} ({words})")
        message = lib.kvo_last_error(cache).decode()
        check(words in message, f"message {message!r} lacks {words!r}")

    expect(lib.kvo_reset_slot(cache, 99), INVALID, "slot 99 is out of range")
    expect(lib.kvo_append(cache, 0, 0, None, None, 1, None), PROTOCOL, "outside a step")
    small = View()
    small.struct_size = 4
    counts = (C.c_int32 * SLOTS)(0, 0)
    check(lib.kvo_begin_step(cache, counts, SLOTS) == KVO_OK, "begin_step")
    expect(lib.kvo_acquire(cache, 0, C.byref(small), None), INVALID, "struct_size")
    check(lib.kvo_abort_step(cache, None) == KVO_OK, "abort_step")
    budget = Options()
    lib.kvo_cache_options_init(C.byref(budget), C.sizeof(budget))
    budget.backend, budget.layers, budget.device_budget = HOST, 4, 1 << 20
    other = C.c_void_p()
    check(lib.kvo_cache_create(C.byref(budget), C.byref(other)) == OOM, "a budget too small")
    check(b"missing" in lib.kvo_last_error(None), "names the missing bytes")
    devices = C.c_int32(-1)
    check(lib.kvo_cuda_device_count(C.byref(devices)) == KVO_OK, "device count")
    budget.backend, budget.device_budget = CUDA, 0
    if devices.value == 0:
        check(lib.kvo_cache_create(C.byref(budget), C.byref(other)) == DEVICE, "CUDA without one")
        check(other.value is None, "a failed create leaves NULL")
    else:
        print("KVO_ERROR_DEVICE not provoked: a GPU is present")
    # KVO_ERROR_INTERNAL is a broken invariant inside the library: nothing from outside should
    # reach it. Its name is still part of the ABI.
    check(lib.kvo_status_name(INTERNAL) == b"internal error", "status names")
    lib.kvo_cache_destroy(cache)
    print(f"{views} views checked through their strides")
    print(f"{checks - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
