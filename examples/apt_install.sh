#!/usr/bin/env bash
# Installs those of the Debian packages named as arguments that are missing
# (apt-get update first, then one apt-get install; sudo when not root). Used by
# setup_debian.sh, .ci/run (Slurm), tests/avx2.sh (clang) and tests/sanitizers.sh
# (clang's runtimes). --no-recommends first: only what the packages depend on.
set -euo pipefail
options=()
[ "${1:-}" = --no-recommends ] && { options+=(--no-install-recommends); shift; }
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${options[@]}" "${missing[@]}"
