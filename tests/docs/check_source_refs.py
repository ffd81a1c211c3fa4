#!/usr/bin/python3
"""Keeps the code's comments honest: every repo path a comment names must exist.

  /usr/bin/python3 tests/docs/check_source_refs.py REPO

A comment's `dir/file.h` (or .cpp, .cu, .cuh, .md, .py, .sh) is looked up
from the repo root and from the commenting file's folder and its parents (so
tensor/ may say cpu/loops.h); #include lines
(system and library headers), paths under build/ and other projects' paths
named as theirs ("Megatron-LM's tensor_parallel/mappings.py") are skipped.
Files move (parallel/bucket.h became parallel/data_parallel/bucket.h); a
comment that still sends the reader to the old place fails this test
(CTest: source_refs_check, label docs). Exits 1 listing each, 0 when none.
"""
import os
import re
import subprocess
import sys

PATH_RE = re.compile(r"(?<![\w/.-])((?:[A-Za-z0-9_]+/)+[A-Za-z0-9_.-]+\.(?:h|cpp|cu|cuh|md|py|sh))\b")
# Other projects' files, named as theirs in a comment: "picotron's data_parallel/bucket.py".
FOREIGN_RE = re.compile(r"(Megatron|picotron|PyTorch|torch|llm\.c|nanotron|torchtitan|DeepSpeed|ColossalAI)\S*\s*\(?\S*\s*$")
EXTENSIONS = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh")


def comment_of(line, path):
    if path.endswith((".py", ".sh")):
        return line.split("#", 1)[1] if "#" in line and not line.lstrip().startswith("#!") else ""
    return line.split("//", 1)[1] if "//" in line else ""


def main():
    repo = sys.argv[1]
    files = subprocess.run(["git", "-C", repo, "ls-files"], capture_output=True, text=True).stdout.split()
    problems, checked = [], 0
    for rel in files:
        if not rel.endswith(EXTENSIONS) or rel.startswith(("fuzz/corpus", "tests/reference")):
            continue
        path = os.path.join(repo, rel)
        if not os.path.exists(path):
            continue
        with open(path, errors="ignore") as f:
            for n, line in enumerate(f, 1):
                if line.lstrip().startswith("#include"):
                    continue
                comment = comment_of(line, rel)
                for m in PATH_RE.finditer(comment):
                    p = m.group(1)
                    if p.startswith(("build/", "out/", "sys/", "gtest/", "gmock/")) or FOREIGN_RE.search(
                            comment[:m.start()]):
                        continue
                    checked += 1
                    folders = [os.path.dirname(rel)]
                    while folders[-1]:
                        folders.append(os.path.dirname(folders[-1]))
                    if not any(os.path.exists(os.path.join(repo, d, p)) for d in folders):
                        problems.append(f"{rel}:{n}: the comment names `{p}`, which is not a file of the repo")
    for p in problems:
        print(p)
    print(f"check_source_refs: {checked} paths in comments checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
