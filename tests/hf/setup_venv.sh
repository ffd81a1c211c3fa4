#!/bin/bash
# The Python side of the Hugging Face tests: a virtual environment with the
# real transformers, safetensors, tokenizers and a CPU torch, from the package
# index. CTest runs this first (the hf_venv fixture); a second run finds the
# stamp and costs nothing.
#   tests/hf/setup_venv.sh VENV      (CMake passes build/hf-venv)
# torch comes from PyTorch's CPU index when that is reachable (about 200 MB),
# else from PyPI, whose Linux wheel pulls the CUDA libraries (several GB).
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
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
fail() {
  echo "hf venv: $1: the Hugging Face tests need transformers, safetensors, tokenizers and torch from the" \
       "Python package index, which this machine could not install (check the network or PIP_INDEX_URL)" >&2
  rm -rf "$venv"
  exit 1
}
if ! timeout 600 "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null; then
  echo "hf venv: PyTorch's CPU index unreachable; torch from PyPI (with its CUDA libraries)"
  timeout 1500 "${pip[@]}" torch || fail "pip install torch failed"
fi
timeout 600 "${pip[@]}" -r "$here/requirements.txt" || fail "pip install -r requirements.txt failed"
"$venv/bin/python" -c "import torch, transformers, safetensors, tokenizers as t; print(f'torch {torch.__version__}, transformers {transformers.__version__}, safetensors {safetensors.__version__}, tokenizers {t.__version__}')" \
  > "$venv/.loom-hf-versions" || fail "the installed packages do not import"
echo "$want" > "$stamp"
echo "hf venv: $venv ready in $(( $(date +%s) - start )) s: $(cat "$venv/.loom-hf-versions"), $(du -sh "$venv" | cut -f1)"
