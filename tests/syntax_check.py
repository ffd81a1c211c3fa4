#!/usr/bin/python3
"""Compiles, with the front end only, every C++ file of a build that the targets built do not.

  python3 tests/syntax_check.py BUILD_DIR TARGET... [--jobs N]

BUILD_DIR was configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON and a CMake
file-API query for the codemodel (tests/avx2.sh makes both), and built for
the TARGETs only. Every compile_commands.json entry of a target outside them
and what they depend on is compiled again with -fsyntax-only in place of
"-c -o OBJECT": the same flags (-Wall -Wextra -Werror, the defines, the
includes), N at a time (default: the CPUs). That parses the file and
instantiates what a full build would, so a missing #include, a construct the
compiler refuses, or a front-end warning (clang's -Wuninitialized and
-Wsometimes-uninitialized, -Wunused-*, the rest of -Wall -Wextra: its semantic
analysis gives them) fails here as it does in a full build; what it skips
is the code generator (its own few warnings, such as the AVX calling
convention's, -Wpsabi), the optimizer and the link. CUDA files (nvcc) are left
out. Prints each failing file's diagnostics; exits 1 if any.
"""
import concurrent.futures
import glob
import json
import os
import re
import shlex
import subprocess
import sys


def built_targets(build, wanted):
    """The TARGETs and every target they depend on, from the file API's codemodel reply."""
    reply = os.path.join(build, ".cmake", "api", "v1", "reply")
    index = json.load(open(max(glob.glob(os.path.join(reply, "index-*.json")))))
    model = json.load(open(os.path.join(reply, index["reply"]["codemodel-v2"]["jsonFile"])))
    targets = {}  # id -> (name, [dependency ids])
    for t in model["configurations"][0]["targets"]:
        detail = json.load(open(os.path.join(reply, t["jsonFile"])))
        targets[t["id"]] = (t["name"], [d["id"] for d in detail.get("dependencies", [])])
    todo = [i for i, (name, _) in targets.items() if name in wanted]
    missing = set(wanted) - {targets[i][0] for i in todo}
    if missing:
        sys.exit(f"syntax_check: no target {' '.join(sorted(missing))} in {build}")
    seen = set()
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo += targets[i][1]
    return {targets[i][0] for i in seen}


def front_end_command(entry):
    """(the entry's target, its command with "-o OBJECT" and "-c" replaced by -fsyntax-only)."""
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    if os.path.basename(args[0]) == "ccache":  # a compiler launcher, where CMake lists it
        args = args[1:]
    out, target, i = [], None, 0
    while i < len(args):
        if args[i] == "-o":  # <dir>/CMakeFiles/<target>.dir/<source>.o
            target = re.search(r"CMakeFiles/([^/]+)\.dir/", args[i + 1]).group(1)
            i += 2
            continue
        if args[i] != "-c":
            out.append(args[i])
        i += 1
    return target, out[:1] + ["-fsyntax-only"] + out[1:]


def main():
    args = sys.argv[1:]
    jobs = os.cpu_count()
    if "--jobs" in args:
        k = args.index("--jobs")
        jobs = int(args[k + 1])
        del args[k:k + 2]
    build, wanted = os.path.abspath(args[0]), args[1:]
    built = built_targets(build, wanted)
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    todo = []
    for e in entries:
        target, command = front_end_command(e)
        if not e["file"].endswith(".cu") and target not in built:
            todo.append((e, command))

    def run(item):
        e, command = item
        r = subprocess.run(command, cwd=e["directory"], capture_output=True, text=True)
        return e["file"], r.returncode, r.stdout + r.stderr

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for path, rc, text in pool.map(run, todo):
            if rc != 0:
                failed.append(path)
                print(text, end="", file=sys.stderr)
    print(f"syntax_check: {len(todo) - len(failed)} of the {len(todo)} files outside the {len(built)} targets built "
          f"pass clang's front end (-fsyntax-only, the build's flags)")
    if failed:
        print("syntax_check: FAILED: " + " ".join(os.path.relpath(p) for p in failed), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
