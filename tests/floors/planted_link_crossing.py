"""The link-time half of the floors check sees a crossing no include shows: a function of a lower
floor (offload/store/) that calls one whose body lives a floor above (prefetch/api/), declared by
hand as a public header would declare it. In a scratch tree with the real cmake/floors.txt, the
two sources compiled into object files where CMake puts them: check_floors.py --objects must
refuse it, naming the caller, the function and where it lives; the same call into offload/util/
(a floor below) must pass.

    python planted_link_crossing.py CXX ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile

CALLER = """int kvo_planted_helper();
int kvo_planted_caller() { return kvo_planted_helper() + 1; }
"""
CALLEE = "int kvo_planted_helper() { return 41; }\n"


def check(cxx, root, callee_folder):
    with tempfile.TemporaryDirectory() as scratch:
        tree = os.path.join(scratch, "tree")
        build = os.path.join(scratch, "build")
        os.makedirs(os.path.join(tree, "cmake"))
        shutil.copy(os.path.join(root, "cmake", "floors.txt"), os.path.join(tree, "cmake"))
        for path, text in (("offload/store/planted_caller.cpp", CALLER),
                           (callee_folder + "planted_callee.cpp", CALLEE)):
            source = os.path.join(tree, path)
            os.makedirs(os.path.dirname(source), exist_ok=True)
            with open(source, "w") as f:
                f.write(text)
            obj = os.path.join(build, "CMakeFiles", "planted.dir", path + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.run([cxx, "-c", source, "-o", obj], check=True)
        return subprocess.run([sys.executable, os.path.join(root, "tools", "check_floors.py"),
                               "--objects", build, tree], capture_output=True, text=True)


def main():
    cxx, root = sys.argv[1], sys.argv[2]
    above = check(cxx, root, "prefetch/api/")
    print(above.stdout, end="")
    expected = ("offload/store/planted_caller.cpp: calls kvo_planted_helper(), defined in "
                "prefetch/api/planted_callee.cpp (floor 2), but floor 1 (offload/store/) may use "
                "only include/kvoffload/, offload/")
    if above.returncode != 1 or expected not in above.stdout:
        print(f"FAIL: a call into prefetch/api/ from offload/store/ was not refused as expected "
              f"(exit {above.returncode})")
        return 1
    below = check(cxx, root, "offload/util/")
    print(below.stdout, end="")
    if below.returncode != 0:
        print(f"FAIL: a call into offload/util/ from offload/store/ was refused")
        return 1
    print("planted crossing refused, the same call a floor below passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
