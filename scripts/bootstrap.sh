#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install what it needs.
# torch is pinned first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TRANSFORMERS_TPU_EXT_VENV:-$root/.venv}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "bootstrap: creating $venv" >&2
    "$python" -m venv "$venv"
fi

# Reinstall only when the dependency declarations change.
stamp="$venv/.transformers-tpu-ext-$(cat "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing $torch_pin and transformers-tpu-ext[test] into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[test]"
    rm -f "$venv"/.transformers-tpu-ext-*
    touch "$stamp"
fi
echo "$venv"
