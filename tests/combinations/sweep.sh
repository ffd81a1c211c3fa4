#!/usr/bin/env bash
# The combination sweep (tests/combinations/README.md): generate the covering
# array, run every case in turn, one line each, then "N passed, M failed".
#   bash tests/combinations/sweep.sh [--full] [--only 3,7] [--train-gpt PATH]
# --full: strength 3 over the parallel sizes x --zero x lifecycle (default: pairwise).
# LOOM_TRAIN_GPT (default build/examples/train_gpt), LOOM_MPIEXEC (default mpirun),
# LOOM_KEEP_WORK_DIRS=1 keeps the runs' directory. Exit 1 on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
full=()
rest=()
for a in "$@"; do
  if [ "$a" = --full ]; then full=(--full); else rest+=("$a"); fi
done
work=$(mktemp -d "${TMPDIR:-/tmp}/loom_combinations.XXXXXX")
python3 "$here/generate.py" "${full[@]}" --out "$work/cases.json"
status=0
python3 "$here/run_case.py" --cases "$work/cases.json" --work "$work" "${rest[@]}" || status=$?
if [ -n "${LOOM_KEEP_WORK_DIRS:-}" ]; then echo "runs kept in $work"; else rm -rf "$work"; fi
exit $status
