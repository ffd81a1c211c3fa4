#!/usr/bin/env bash
# Which libraries the unpacked bundle ROOT loads from the machine, by ldd over
# its programs, libraries and plugins (with the caller's LD_LIBRARY_PATH):
#
#   bash tests/cuda/bundle_ldd_check.sh ROOT          # prints those outside the allowed set (none: nothing)
#   bash tests/cuda/bundle_ldd_check.sh ROOT --cuda   # prints where CUDA's libraries were found
#
# Allowed from the machine (tests/cuda/bundle_runtime.sh carries the rest):
# glibc's libraries, the driver (libcuda) and CUDA's cudart, cuBLAS, cuBLASLt, NCCL.
set -uo pipefail
root=$(cd "$1" && pwd)
allowed='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
cuda='^(libcudart|libcublas|libcublasLt|libnccl)\.so'
files=("$root"/bin/*)
for f in "$root"/lib/*.so* "$root"/lib/openmpi3/*.so "$root"/lib/pmix/*.so; do [ -e "$f" ] && files+=("$f"); done
resolved=$(for f in "${files[@]}"; do ldd "$f" 2> /dev/null; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
if [ "${2:-}" = --cuda ]; then
  echo "$resolved" | awk -v re="$cuda" '$1 ~ re {printf "%s%s -> %s", sep, $1, $2; sep = ", "} END {print ""}'
  exit 0
fi
echo "$resolved" | awk -v root="$root/" -v re="$allowed" 'index($2, root) != 1 && $1 !~ re {print $1 " (" $2 ")"}' | tr '\n' ' '
