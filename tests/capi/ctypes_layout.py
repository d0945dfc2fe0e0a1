"""The Python package's ctypes mirrors of the C ABI's structs (kvoffload/_capi.py) lay out every
field where the C compiler does, and have no field the header lacks or lack one it has: a field
missed or misplaced would make ctypes read or write another field's bytes.

    python3 ctypes_layout.py ABI_LAYOUT_PROGRAM       (with the package on PYTHONPATH)
"""
import ctypes
import subprocess
import sys

from kvoffload import _capi

MIRRORS = {"kvo_cache_options": _capi.Options, "kvo_layer_view": _capi.View,
           "kvo_cache_stats": _capi.Stats, "kvo_saved_context_info": _capi.SavedContextInfo}


def main():
    printed = subprocess.run([sys.argv[1]], check=True, capture_output=True, text=True).stdout
    c_fields = {name: [] for name in MIRRORS}
    c_sizes = {}
    for line in printed.splitlines():
        struct, field, *numbers = line.split()
        if field == "sizeof":
            c_sizes[struct] = int(numbers[0])
        else:
            c_fields[struct].append((field, int(numbers[0]), int(numbers[1])))
    problems = []
    for struct, mirror in MIRRORS.items():
        mine = [(name, getattr(mirror, name).offset, getattr(mirror, name).size)
                for name, _ in mirror._fields_]
        if mine != c_fields[struct]:
            problems.append(f"{struct}: C lays out {c_fields[struct]}, ctypes {mine}")
        if ctypes.sizeof(mirror) != c_sizes[struct]:
            problems.append(f"{struct}: sizeof {c_sizes[struct]} in C, {ctypes.sizeof(mirror)} "
                            "in ctypes")
    for problem in problems:
        print("FAILED:", problem)
    fields = sum(len(v) for v in c_fields.values())
    print(f"{len(MIRRORS)} structs, {fields} fields compared: {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
