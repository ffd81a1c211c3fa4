# Sourced by the bench scripts that run train_gpt (zero.sh, zero2.sh, moe.sh):
# mpirun allowed as root, a scratch folder $TMP removed on exit, and how they
# read a run back.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# median_field FIELD LOG: the median of FIELD ("ms", "tokens_per_s") over the
# steps 2..N of a --log file (the first warms up); of an even count, the lower middle.
median_field() {
  tail -n +2 "$2" | sed "s/.*\"$1\": \([0-9.]*\).*/\1/" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

# rank0_row OUT: rank 0's row of --memory-report's table in train_gpt's output:
#   | params m / p | grads m / p | optimizer m / p | bytes/param m / p | ...
rank0_row() { grep -E '^ +0 +[0-9]+ +\|' "$1"; }
