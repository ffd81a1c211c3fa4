#!/usr/bin/env bash
# bad_input.sh TRAIN_GPT CORPUS MODE: a multi-host job whose hosts are not set
# up alike, run inside hosts.sh (2 hosts, one rank each). Each host runs its
# rank from a folder of its own, $LOOM_MH_DIR/<host> (as each machine of a
# cluster has its own disk), through a wrapper that knows its hostname.
# Modes:
#   build  h1's train_gpt is "another build" (LOOM_TEST_BUILD_NOTE=asan there
#          alone, parallel/comm/build_info.h)
#   data   h1's corpus.txt has one line more than h0's: the same --data
#          corpus.txt on both, another text
# Both: the job exits non-zero within 20 s; the error names the handshake
# ("ranks disagree on the build" / "... on the data (--data corpus.txt)"),
# the field with each rank's value, and the host of each rank ("hosts: rank 0
# on h0; rank 1 on h1"); the checkpoint that --save names keeps its old bytes
# and no optimizer file appears beside it (the job stops before training).
set -uo pipefail
train=$1 corpus=$2 mode=$3
d=${LOOM_MH_DIR:?bad_input.sh runs inside hosts.sh}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
fail() {
  echo "bad_input.sh $mode: FAIL: $*"
  echo "---- the command's output"; cat "$d/out.txt" 2>/dev/null
  exit 1
}

mkdir -p "$d/h0" "$d/h1"
case "$mode" in
  build) cp "$corpus" "$d/h0/corpus.txt"; cp "$corpus" "$d/h1/corpus.txt"
         note='[ "$(hostname)" = h1 ] && export LOOM_TEST_BUILD_NOTE=asan' ;;
  data)  head -n 60 "$corpus" > "$d/h0/corpus.txt"; head -n 61 "$corpus" > "$d/h1/corpus.txt"
         note='' ;;
  *) echo "bad_input.sh: unknown mode '$mode'"; exit 2 ;;
esac
# The rank's wrapper: its host's folder, and on h1 the other build.
cat > "$d/as_host.sh" << EOF
#!/bin/sh
$note
cd "$d/\$(hostname)" && exec "\$@"
EOF
chmod +x "$d/as_host.sh"
# An earlier run's checkpoint, which this run must not touch.
ckpt=$d/ckpt.safetensors
printf 'an earlier checkpoint\n' > "$ckpt"
cp "$ckpt" "$d/ckpt.before"

t0=$(now_ms)
LOOM_COLLECTIVE_TIMEOUT=30 timeout -k 5 60 "$LOOM_MH_MPIRUN" -np 2 "$d/as_host.sh" "$train" --dp 2 --steps 5 \
  --layers 2 --heads 2 --embd 32 --block 16 --batch 4 --threads 1 --eval-every 0 --sample 0 --data corpus.txt \
  --save "$ckpt" > "$d/out.txt" 2>&1
rc=$? ms=$(($(now_ms) - t0))
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$ms" -le 20000 ] || fail "the job took $ms ms to fail (limit 20000)"
if [ "$mode" = build ]; then
  grep -qF "ranks disagree on the build (group world, size 2)" "$d/out.txt" || fail "no build disagreement"
  grep -qF "test build note: (missing) on rank 0; 'asan' on rank 1" "$d/out.txt" || fail "the build field not named"
else
  grep -qF "ranks disagree on the data (--data corpus.txt) (group world, size 2)" "$d/out.txt" ||
    fail "no data disagreement"
  b0=$(wc -c < "$d/h0/corpus.txt") b1=$(wc -c < "$d/h1/corpus.txt")
  grep -qF "corpus bytes: '$b0' on rank 0; '$b1' on rank 1" "$d/out.txt" || fail "the corpus sizes not named"
  grep -Eq "corpus hash \(FNV-1a\): '[0-9a-f]{16}' on rank 0; '[0-9a-f]{16}' on rank 1" "$d/out.txt" ||
    fail "the corpus hashes not named"
fi
grep -qF "hosts: rank 0 on h0; rank 1 on h1" "$d/out.txt" || fail "the hosts not named"
cmp -s "$ckpt" "$d/ckpt.before" || fail "--save's checkpoint was overwritten"
[ ! -e "$ckpt.optim.safetensors" ] || fail "an optimizer state was written beside --save's checkpoint"
[ "$(ls "$d" | grep -c '^ckpt')" -eq 2 ] || fail "files left beside the checkpoint: $(ls "$d" | grep '^ckpt')"
echo "bad_input.sh $mode: PASS: exit code $rc after $ms ms; $(grep -F -A4 'ranks disagree' "$d/out.txt" | head -6)"
