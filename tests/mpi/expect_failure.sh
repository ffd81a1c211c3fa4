#!/usr/bin/env bash
# Runs a command that is supposed to fail, for CTest: passes when the command
# exits non-zero within MAX_SECONDS and its output (stdout + stderr) matches
# the extended regex. Usage: expect_failure.sh MAX_SECONDS REGEX COMMAND...
max=$1 regex=$2
shift 2
start_ms=$(($(date +%s%N) / 1000000))
out=$(timeout $((2 * max)) "$@" 2>&1)
rc=$?
elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
printf '%s\n' "$out"
echo "expect_failure: exit code $rc after ${elapsed_ms} ms (limit ${max} s)"
if [ "$rc" -eq 0 ]; then echo "expect_failure: FAIL: the command succeeded"; exit 1; fi
if [ "$elapsed_ms" -gt $((max * 1000)) ]; then echo "expect_failure: FAIL: too slow"; exit 1; fi
if ! grep -Eq -- "$regex" <<<"$out"; then echo "expect_failure: FAIL: output does not match: $regex"; exit 1; fi
echo "expect_failure: PASS"
