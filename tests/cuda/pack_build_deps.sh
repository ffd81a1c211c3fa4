#!/usr/bin/env bash
# Plan B's luggage: what building loom on the GPU machine needs beyond its
# image (nvcc, CMake, ninja, a C++ compiler), packed here from Debian's
# packages, for tests/cuda/build_on_device.sh:
#   usr/    the header-only and static libraries, as Debian installs them
#           (Eigen, nlohmann/json, CLI11, GoogleTest and GoogleMock), with their CMake
#           package files, which find their folder relative to themselves
#   openblas/  cblas.h and friends, and libopenblas.so.0 with the libraries it
#           loads (libgfortran, libquadmath: the bundle's copies, whose run
#           path is their own folder)
# No MPI: plan B builds with -DLOOM_MPI=OFF (one process's MPI stand-in).
#
#   bash tests/cuda/pack_build_deps.sh OUT.tar.xz BUNDLE_LIB   (the bundle's lib/, from bundle_runtime.sh)
set -euo pipefail
out=$1
bundle_lib=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for pkg in libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev; do
  dpkg -L "$pkg" > /dev/null 2>&1 || { echo "pack_build_deps.sh: $pkg is not installed (examples/setup_debian.sh)" >&2; exit 1; }
  # Headers, static libraries and CMake files; not documentation.
  dpkg -L "$pkg" | grep -E '^/usr/(include|lib|share/(eigen3|cmake|pkgconfig))/' | while read -r f; do
    [ -f "$f" ] || continue
    mkdir -p "$stage$(dirname "$f")"
    cp "$f" "$stage$f"
  done
done
mkdir -p "$stage/openblas"
cp "$(dirname "$(readlink -f /usr/include/x86_64-linux-gnu/cblas.h)")"/*.h "$stage/openblas/"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0; do cp "$bundle_lib/$lib" "$stage/openblas/"; done
ln -s libopenblas.so.0 "$stage/openblas/libopenblas.so"  # what the linker looks for
tar -C "$stage" -cJf "$out.tmp" usr openblas
mv "$out.tmp" "$out"
echo "build deps: $out, $(du -k "$out" | cut -f1) KiB packed ($(du -sk "$stage" | cut -f1) KiB unpacked)"
