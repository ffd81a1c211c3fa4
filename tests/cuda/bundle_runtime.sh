#!/usr/bin/env bash
# What the bundle's programs need at run time, carried with them, so that on
# the GPU machine only glibc, the driver (libcuda) and CUDA's own libraries
# (cudart, cuBLAS, cuBLASLt, NCCL: the image has them, and they are too large
# to carry) come from the machine. Called by build_bundle.sh with its staging
# folder STAGE, whose bin/ holds the programs:
#
#   bash tests/cuda/bundle_runtime.sh STAGE
#
# adds, beside bin/:
#   bin/mpirun, bin/orted   Open MPI's launcher (Debian's orterun) and daemon
#   lib/                    every shared library the programs, mpirun and the
#                           plugins below load, except the machine's (ALLOWED)
#   lib/openmpi3/, lib/pmix/  Open MPI's and PMIx's plugins (components that
#                           need InfiniBand, UCX, libfabric or PSM are left
#                           out: one node's shared memory needs none of them)
#   share/, etc/            their help texts and default parameters
#   env.sh                  sourced by gpu_runner.sh: points Open MPI and PMIx
#                           at these folders (OPAL_PREFIX and friends)
# Every program and library gets a run path relative to itself ($ORIGIN), so
# the bundle works wherever it is unpacked.
set -euo pipefail
stage=$1
command -v patchelf > /dev/null || { echo "bundle_runtime.sh: needs patchelf (apt-get install patchelf)" >&2; exit 1; }
# Loaded from the machine, never carried: glibc's libraries, the driver, CUDA's.
allowed='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
# Plugins that load these are left out (networks one GPU machine does not have).
heavy='^(libucp|libucs|libuct|libucm|libfabric|libibverbs|librdmacm|libpsm_infinipath|libpsm2|libflux|libnvidia)'
ompi_plugins=$(ompi_info --path pkglibdir --parsable | sed 's/.*://')  # /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_prefix=$(dirname "$(dirname "$(find /usr/lib -path '*pmix*/lib/pmix' -type d | head -n 1)")")  # .../pmix2
ompi_data=$(ompi_info --path pkgdatadir --parsable | sed 's/.*://')  # /usr/share/openmpi
ompi_etc=$(ompi_info --path sysconfdir --parsable | sed 's/.*://')   # /etc/openmpi

mkdir -p "$stage/lib/openmpi3" "$stage/lib/pmix" "$stage/share" "$stage/etc"
strip -o "$stage/bin/mpirun" "$(readlink -f "$(command -v mpirun)")"
strip -o "$stage/bin/orted" "$(command -v orted)"

# deps FILE...: the sonames and paths ldd resolves, one "soname path" a line.
deps() { for f in "$@"; do [ -e "$f" ] && ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u; }

dropped=()
for p in "$ompi_plugins"/mca_*.so "$pmix_prefix"/lib/pmix/*.so; do
  if deps "$p" | awk '{print $1}' | grep -Eq "$heavy"; then dropped+=("$(basename "$p" .so)"); continue; fi
  case $p in
    "$ompi_plugins"/*) cp "$p" "$stage/lib/openmpi3/" ;;
    *) cp "$p" "$stage/lib/pmix/" ;;
  esac
done

# The closure: the libraries of the programs and plugins, then theirs, until nothing new.
while :; do
  new=0
  while read -r soname path; do
    [[ $soname =~ $allowed ]] && continue
    [ -e "$stage/lib/$soname" ] && continue
    cp -L "$path" "$stage/lib/$soname"
    new=1
  done < <(deps "$stage"/bin/* "$stage"/lib/*.so* "$stage"/lib/openmpi3/*.so "$stage"/lib/pmix/*.so)
  [ $new = 1 ] || break
done
strip --strip-unneeded "$stage"/lib/*.so* "$stage"/lib/openmpi3/*.so "$stage"/lib/pmix/*.so 2> /dev/null || true

for f in "$stage"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$stage"/lib/*.so*; do patchelf --set-rpath '$ORIGIN' "$f"; done
for f in "$stage"/lib/openmpi3/*.so "$stage"/lib/pmix/*.so; do patchelf --set-rpath '$ORIGIN/..' "$f"; done

cp -r "$ompi_data" "$stage/share/openmpi"
cp -r "$pmix_prefix/share/pmix" "$stage/share/pmix"
cp "$ompi_etc"/openmpi-mca-params.conf "$stage/etc/"
# One machine: mpirun starts its ranks itself (plm isolated); the default
# (rsh) first looks for ssh, which a bare image does not have.
printf '%s\n' '# tests/cuda/bundle_runtime.sh: one machine, no ssh' 'plm = isolated' >> "$stage/etc/openmpi-mca-params.conf"
cp "$pmix_prefix"/share/pmix-mca-params.conf "$stage/etc/" 2> /dev/null || true

# Open MPI finds its plugins, help texts and parameters through its install
# folders, which these variables override (opal/mca/installdirs/env); PMIx
# likewise, and its plugin path is set outright (Debian's
# pmix-mca-params.conf names /usr/lib/.../pmix2/lib/pmix).
cat > "$stage/env.sh" << 'EOF'
# Sourced with the bundle's folder in $bundle_root (gpu_runner.sh does).
export OPAL_PREFIX=$bundle_root OPAL_BINDIR=$bundle_root/bin OPAL_LIBDIR=$bundle_root/lib
export OPAL_PKGLIBDIR=$bundle_root/lib/openmpi3 OPAL_DATADIR=$bundle_root/share OPAL_PKGDATADIR=$bundle_root/share/openmpi
export OPAL_SYSCONFDIR=$bundle_root/etc
export PMIX_PREFIX=$bundle_root PMIX_LIBDIR=$bundle_root/lib PMIX_PKGLIBDIR=$bundle_root/lib/pmix
export PMIX_DATADIR=$bundle_root/share PMIX_PKGDATADIR=$bundle_root/share/pmix PMIX_SYSCONFDIR=$bundle_root/etc
export PMIX_MCA_mca_base_component_path=$bundle_root/lib/pmix
export PATH=$bundle_root/bin:$PATH
EOF
echo "runtime: $(ls "$stage/lib" | grep -c '\.so') libraries, $(ls "$stage/lib/openmpi3" | wc -l) Open MPI and" \
  "$(ls "$stage/lib/pmix" | wc -l) PMIx plugins carried; left out (their networks): ${dropped[*]:-none}"
