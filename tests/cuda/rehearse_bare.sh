#!/usr/bin/env bash
# The GPU session's runner, rehearsed here in a bare root file system: a
# minimal Debian (debootstrap --variant=minbase, plus xz-utils to unpack and
# python3 to compare losses, as the GPU image's python3 does) holding
# no Open MPI, no OpenBLAS, no libgomp, no CUDA; only CUDA's libraries are
# bind-mounted from this machine, as the GPU image has its own. If a program
# of the bundle needed anything else from the machine, it would fail here,
# not in the GPU session's 15 minutes.
#
#   bash tests/cuda/build_bundle.sh && bash tests/cuda/rehearse_bare.sh   # as root
#
# Checks, in the bare system: tests/cuda/bundle_ldd_check.sh finds no library
# loaded from outside the bundle but glibc's and CUDA's, then gpu_runner.sh
# runs every phase (the GPU steps skip: no driver here; the CPU steps must
# pass). Logs: $OUT (default out/bare), as on the GPU machine.
# The root file system is made once (~240 MB, 2 minutes) and kept in ROOT.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
root=${ROOT:-/var/tmp/loom-bare-bookworm}
out=${OUT:-out/bare}
case $out in /*) echo "rehearse_bare.sh: OUT=$out must be a path inside the repository (the chroot sees it as /repo/OUT)" >&2; exit 2;; esac
cuda_lib=$(dirname "$(readlink -f /usr/local/cuda/lib/libcudart.so.13 2> /dev/null || find /usr/local/cuda*/ -name 'libcudart.so.13' | head -n 1)")
[ "$(id -u)" = 0 ] || { echo "rehearse_bare.sh: needs root (chroot and mounts)" >&2; exit 2; }
[ -f build-gpu-bundle/loom-gpu-bundle.tar.xz ] || { echo "rehearse_bare.sh: no bundle (bash tests/cuda/build_bundle.sh first)" >&2; exit 2; }
if [ ! -x "$root/bin/bash" ]; then
  command -v debootstrap > /dev/null || { echo "rehearse_bare.sh: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
  debootstrap --variant=minbase --include=xz-utils,python3 bookworm "$root" http://deb.debian.org/debian
fi
for lib in libmpi.so.40 libopenblas.so.0 libgomp.so.1 libcudart.so.13; do  # the bare system really is bare
  if [ -n "$(find "$root/usr/lib" "$root/lib" -name "$lib" 2> /dev/null | head -n 1)" ]; then
    echo "rehearse_bare.sh: $root holds $lib: not a bare system" >&2
    exit 2
  fi
done

mounts=()
bind() {  # bind SOURCE TARGET [ro]
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$root$2"
  mounts=("$root$2" "${mounts[@]}")
}
cleanup() { for m in "${mounts[@]}"; do umount -l "$m" || true; done; }
trap cleanup EXIT
bind /proc /proc
bind /sys /sys ro
bind /dev /dev
bind "$repo" /repo
bind "$cuda_lib" /usr/local/cuda/lib64 ro
rm -rf "$out" && mkdir -p "$root/tmp" "$out"  # the runner appends to its summary
chmod 1777 "$root/tmp"

chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 OUT="/repo/$out" \
  LIB_ROOTS="/usr/local/cuda/lib64" DEADLINE="${DEADLINE:-540}" RUN_DIR=build-gpu-bare \
  /bin/bash -c 'cd /repo && bash tests/cuda/gpu_runner.sh "$@"' runner "$@"
status=0
grep -q "machine's libraries: passed" "$out/summary.txt" || status=1
grep -E ": failed" "$out/summary.txt" && status=1
echo "rehearse_bare.sh: $([ $status = 0 ] && echo passed || echo FAILED) (summary: $out/summary.txt)"
exit $status
