#!/usr/bin/env python3
"""Checks the tree against its floors (cmake/floors.txt): every C, C++ and CUDA file belongs to one
row (the longest folder that holds it), and

- every quoted include with a folder in it ("offload/util/printable.hpp", "kvoffload/cache.hpp"
  for include/kvoffload/) names a folder its row may include;
- with --objects BUILD, every object file under BUILD (CMake's <target>.dir/<source>.o) calls
  only what its row may use: a symbol it needs that another object defines (a strong definition:
  text, data, read-only data or bss) must be defined in a folder its row may include or on a lower
  floor (the public API's bodies, for the model and the tools). This sees
  what includes cannot: a function declared in a public header whose body lives a floor above
  (offload/ calling into prefetch/ through kvoffload/types.hpp).

A lower floor never includes or calls a higher one, and within a floor only what the row lists.
Prints each violation and exits 1; 0 when there is none. (The build gives each target a view of
the tree holding what its floor may include, cmake/kvoffload_floors.cmake; this also sees inside
one target, e.g. offload/ against prefetch/ in libkvoffload.)

    check_floors.py [--objects BUILD] [ROOT]
"""
import os
import re
import subprocess
import sys

SOURCES = (".c", ".h", ".cpp", ".hpp", ".inc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
STRONG = set("TDBR")  # nm's kinds of a definition that only one object may make


def read_floors(path):
    """[(floor, folder, [may include...], what)] from cmake/floors.txt."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            floor, folder, allowed, what = (c.strip() for c in line.split("|", 3))
            rows.append((int(floor), folder, allowed.split(), what))
    return rows


def row_of(rows, path):
    return max((r for r in rows if path.startswith(r[1])), key=lambda r: len(r[1]), default=None)


def include_path(name):
    """The tree path an include names: kvoffload/ lives in include/."""
    return "include/" + name if name.startswith("kvoffload/") else name


def check_includes(root, rows):
    files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    problems = checked = 0
    for f in files:
        if not f.endswith(SOURCES):
            continue
        row = row_of(rows, f)
        if row is None:
            print(f"{f}: in no floor of cmake/floors.txt")
            problems += 1
            continue
        floor, folder, allowed, _ = row
        if "*" in allowed:
            continue
        checked += 1
        with open(os.path.join(root, f), errors="replace") as src:
            text = src.read()
        for match in INCLUDE.finditer(text):
            name = match.group(1)
            if "/" not in name:
                continue  # a file beside it
            target = include_path(name)
            if not any(target.startswith(a) for a in allowed):
                line = text.count("\n", 0, match.start()) + 1
                print(f"{f}:{line}: includes {name}, but floor {floor} ({folder}) may include "
                      f"only {', '.join(allowed)}")
                problems += 1
    print(f"check_floors: {checked} files checked against {len(rows)} folders, "
          f"{problems} problem(s)")
    return problems


def source_of(root, build, obj):
    """The tree path of the source an object file of CMake's was compiled from, or None:
    <build>/<dir>/CMakeFiles/<target>.dir/<path relative to dir, '..' as '__'>.o"""
    rel = os.path.relpath(obj, build)
    parts = rel.split(os.sep)
    if "CMakeFiles" not in parts:
        return None
    at = parts.index("CMakeFiles")
    if at + 1 >= len(parts) or not parts[at + 1].endswith(".dir"):
        return None
    directory = os.path.join(*parts[:at]) if at else ""
    inner = [".." if p == "__" else p for p in parts[at + 2:]]
    source = os.path.normpath(os.path.join(directory, *inner))[:-len(".o")]
    if source.startswith("..") or not os.path.isfile(os.path.join(root, source)):
        return None
    return source


def symbols(obj):
    """(strong definitions, needs) of an object file, as nm names them (mangled)."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True).stdout
    defined, needed = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            needed.add(name)
        elif kind in STRONG:
            defined.add(name)
    return defined, needed


def demangle(name):
    out = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    return out or name


def check_objects(root, build, rows):
    objects = []
    for directory, _, names in os.walk(build):
        for n in names:
            if n.endswith(".o"):
                source = source_of(root, build, os.path.join(directory, n))
                if source is not None:
                    objects.append((os.path.join(directory, n), source))
    home = {}  # symbol -> the sources defining it
    needs = []
    for obj, source in objects:
        defined, needed = symbols(obj)
        for name in defined:
            home.setdefault(name, set()).add(source)
        needs.append((source, needed))
    problems = 0
    seen = set()
    for source, needed in needs:
        row = row_of(rows, source)
        if row is None or "*" in row[2]:
            continue
        floor, folder, allowed, _ = row
        for name in sorted(needed):
            for where in sorted(home.get(name, ())):
                other = row_of(rows, where)
                # What the row lists, or a lower floor (through the public API, whose bodies live
                # in offload/ and prefetch/): never a higher floor, nor a folder of its own floor
                # it does not list.
                lower = other is not None and other[0] < floor
                if any(where.startswith(a) for a in allowed) or lower or (source, name) in seen:
                    continue
                seen.add((source, name))
                print(f"{source}: calls {demangle(name)}, defined in {where} "
                      f"(floor {other[0] if other else '?'}), but floor {floor} ({folder}) may use "
                      f"only {', '.join(allowed)}")
                problems += 1
    print(f"check_floors: {len(objects)} object files checked against {len(rows)} folders, "
          f"{problems} problem(s)")
    return problems


def main(argv):
    args = argv[1:]
    build = None
    if args[:1] == ["--objects"]:
        if len(args) < 2:
            print("check_floors: --objects needs a build folder")
            return 2
        build, args = os.path.abspath(args[1]), args[2:]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = read_floors(os.path.join(root, "cmake", "floors.txt"))
    if not rows:
        print("check_floors: cmake/floors.txt has no floors")
        return 1
    if build is not None:
        return 1 if check_objects(root, build, rows) else 0
    return 1 if check_includes(root, rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
