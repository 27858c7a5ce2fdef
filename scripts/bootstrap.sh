#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install what it needs.
# torch is pinned first: a bare `torch` requirement would pull a multi-GB CUDA build.
# The first use takes about 90 s; each step is announced on stderr (stdout is the venv's path).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TRANSFORMERS_TPU_EXT_VENV:-$root/.venv}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
python="${PYTHON:-python3}"

# Reinstall only when the dependency declarations change.
stamp="$venv/.transformers-tpu-ext-$(cat "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    started=$SECONDS
    if [ ! -x "$venv/bin/python" ]; then
        echo "bootstrap: [1/3] creating $venv" >&2
        "$python" -m venv "$venv"
    else
        echo "bootstrap: [1/3] reusing $venv (the declared dependencies changed)" >&2
    fi
    echo "bootstrap: [2/3] installing $torch_pin (CPU build; about 30 s)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin"
    echo "bootstrap: [3/3] installing transformers-tpu-ext[test] and its dependencies (about 60 s; $((SECONDS - started)) s so far)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root[test]"
    rm -f "$venv"/.transformers-tpu-ext-*
    touch "$stamp"
    echo "bootstrap: ready in $((SECONDS - started)) s" >&2
fi
echo "$venv"
