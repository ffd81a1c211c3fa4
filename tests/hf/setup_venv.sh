#!/bin/bash
# The Python side of the Hugging Face tests: a virtual environment with the
# real transformers, safetensors and tokenizers from the package index, on top
# of Debian's python3-torch 1.13 (the venv sees /usr/bin/python3's packages).
# CTest runs this first (the hf_venv fixture); a second run finds the stamp
# and costs nothing.
#   tests/hf/setup_venv.sh VENV      (CMake passes build/hf-venv)
# Why Debian's torch: PyTorch's own CPU index (download.pytorch.org) is not
# reachable from loom's machines, and PyPI's torch wheel pulls the CUDA
# libraries: measured 893 s and 5.6 GB, against ~2 min of apt (python3-torch,
# ~80 MB of packages, also what tests/reference uses) and ~20 s of pip here.
# transformers 4.40.2 is the last release that runs on torch 1.13.
# Without the package index this fails, saying so: the tests then fail too,
# they are never skipped.
set -euo pipefail
venv=$1
here=$(cd "$(dirname "$0")" && pwd)
stamp=$venv/.loom-hf-ready
want=$(cat "$here/requirements.txt" "$0" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "hf venv: $venv is ready ($(cat "$venv/.loom-hf-versions" 2>/dev/null))"
  exit 0
fi
start=$(date +%s)
fail() {
  echo "hf venv: $1: the Hugging Face tests need transformers, safetensors and tokenizers from the" \
       "Python package index and Debian's python3-torch, which this machine could not install" \
       "(check the network or PIP_INDEX_URL)" >&2
  rm -rf "$venv"
  exit 1
}
# Debian's torch and venv module (apt_install.sh: only what is missing; sudo when not root).
if ! /usr/bin/python3 -c "import torch, ensurepip" 2>/dev/null; then
  bash "$here/../../examples/apt_install.sh" python3-torch python3-venv || fail "apt-get install python3-torch failed"
fi
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv" || fail "python3 -m venv failed"
timeout 600 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$here/requirements.txt" ||
  fail "pip install -r requirements.txt failed"
"$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers as t; print(f'torch {torch.__version__}, transformers {transformers.__version__}, safetensors {safetensors.__version__}, tokenizers {t.__version__}')" \
  > "$venv/.loom-hf-versions" || fail "the installed packages do not import"
echo "$want" > "$stamp"
echo "hf venv: $venv ready in $(( $(date +%s) - start )) s: $(cat "$venv/.loom-hf-versions"), $(du -sh "$venv" | cut -f1)"
