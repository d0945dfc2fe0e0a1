#!/usr/bin/env python3
"""Checks the include graph against the floors of README.md's "Layout" table: every C, C++ and
CUDA file of the tree belongs to one row (the longest folder that holds it), and every quoted
include with a folder in it ("offload/util/printable.hpp", "kvoffload/cache.hpp" for
include/kvoffload/) names a folder its row may include. A lower floor never includes a higher one,
and within a floor only what the row lists. Prints each violation and exits 1; 0 when there is
none. (The build enforces the same per target, cmake/kvoffload_floors.cmake; this also sees
inside one target, e.g. offload/ against prefetch/ in libkvoffload.)

    check_floors.py [ROOT]
"""
import os
import re
import subprocess
import sys

SOURCES = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folders(cell):
    return [c.strip().strip("`") for c in cell.split(",") if c.strip().strip("`")]


def read_floors(readme):
    """[(floor, folder, [may include...])] from the Layout table."""
    text = open(readme).read()
    start = text.index("## Layout")
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        for folder in folders(cells[1]):
            rows.append((int(cells[0]), folder.rstrip("/") + "/", [f.rstrip("/") + "/" for f in
                                                                  folders(cells[3])]))
    return rows


def include_path(name):
    """The tree path an include names: kvoffload/ lives in include/."""
    return "include/" + name if name.startswith("kvoffload/") else name


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = read_floors(os.path.join(root, "README.md"))
    if not rows:
        print("check_floors: README.md's Layout has no floors table")
        return 1
    files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    problems = 0
    checked = 0
    for f in files:
        if not f.endswith(SOURCES):
            continue
        row = max((r for r in rows if f.startswith(r[1])), key=lambda r: len(r[1]), default=None)
        if row is None:
            print(f"{f}: in no floor of README.md's Layout table")
            problems += 1
            continue
        floor, folder, allowed = row
        if "*/" in allowed:
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
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
