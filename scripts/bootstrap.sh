#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install what it needs.
# The first use takes a few minutes (6 on 2 busy cores with a local torch wheel: torch 40 s, the rest 5 min);
# each step is announced on stderr with the seconds it took (stdout is the venv's path).
#
# torch comes first, as a CPU build: a bare `torch` requirement (or this pin, on PyPI) is the multi-GB
# CUDA build on Linux. In order, the first that works:
#   1. a wheel pip finds without any index (PIP_FIND_LINKS, a local wheel directory): torch itself offline;
#      its few small dependencies from the same directory when they are there, else from the package index
#      (torch is then installed already, so pip takes only what is missing, never another torch);
#   2. PyTorch's CPU index (TORCH_INDEX_URL, default https://download.pytorch.org/whl/cpu), if it answers
#      within 5 seconds (an unreachable index fails fast instead of hanging pip's retries);
#   3. the default index, with a warning that it may be the CUDA build.
# TORCH_PIN overrides the pin (e.g. TORCH_PIN=torch==2.15.0).
#
# Everything else is installed from the tested set, constraints.txt (the releases CI's main suite ran), so a
# fresh clone is green whatever was released this morning; scripts/newest.sh tests the newest releases.
# TRANSFORMERS_TPU_EXT_CONSTRAINTS names another constraints file, or `none` to resolve the newest.
set -euo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
venv="${TRANSFORMERS_TPU_EXT_VENV:-$root/.venv}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
python="${PYTHON:-python3}"
pip=(--quiet --disable-pip-version-check)
constraints="${TRANSFORMERS_TPU_EXT_CONSTRAINTS:-$root/constraints.txt}"
constrained=()
[ "$constraints" = none ] || constrained=(-c "$constraints")

reachable() {  # $1: a URL; true when it answers within 5 s (any HTTP status counts: it is there)
    "$python" - "$1" <<'EOF' >/dev/null 2>&1
import os, sys, urllib.error, urllib.parse, urllib.request
url = sys.argv[1]
if url.startswith("file:"):  # a local index directory
    sys.exit(0 if os.path.exists(urllib.request.url2pathname(urllib.parse.urlparse(url).path)) else 1)
try:
    urllib.request.urlopen(url, timeout=5)
except urllib.error.HTTPError:
    pass
EOF
}

install_torch() {
    local cpu_pin="$torch_pin"
    [[ "$torch_pin" =~ ^torch==[0-9.]+$ ]] && cpu_pin="$torch_pin+cpu"  # the CPU index's local version
    if "$venv/bin/python" -m pip install "${pip[@]}" --no-index "$torch_pin" 2>/dev/null; then
        echo "bootstrap:       $torch_pin from a local wheel" >&2
    elif "$venv/bin/python" -m pip install "${pip[@]}" --no-index --no-deps "$torch_pin" 2>/dev/null; then
        echo "bootstrap:       $torch_pin from a local wheel, its dependencies from the package index" >&2
        "$venv/bin/python" -m pip install "${pip[@]}" "$torch_pin"
    elif reachable "$torch_index"; then
        echo "bootstrap:       $cpu_pin from $torch_index" >&2
        "$venv/bin/python" -m pip install "${pip[@]}" --extra-index-url "$torch_index" "$cpu_pin"
    else
        echo "bootstrap: warning: $torch_index cannot be reached; installing $torch_pin from the default index," \
            "which may be the CUDA build (several GB). Set TORCH_INDEX_URL to a CPU wheel index to avoid it." >&2
        "$venv/bin/python" -m pip install "${pip[@]}" "$torch_pin"
    fi
}

# Reinstall only when the dependency declarations change.
stamp="$venv/.transformers-tpu-ext-$(cat "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" \
    "${constrained[@]:1}" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    started=$SECONDS
    if [ ! -x "$venv/bin/python" ]; then
        echo "bootstrap: [1/3] creating $venv" >&2
        "$python" -m venv "$venv"
    else
        echo "bootstrap: [1/3] reusing $venv (the declared dependencies changed)" >&2
    fi
    step=$SECONDS
    echo "bootstrap: [2/3] installing $torch_pin, a CPU build (about 40 s from a local wheel; plus a 200 MB download otherwise)" >&2
    install_torch
    echo "bootstrap:       done in $((SECONDS - step)) s" >&2
    step=$SECONDS
    echo "bootstrap: [3/3] installing transformers-tpu-ext[test,trl,embeddings] and its dependencies" \
        "(about 75 packages: 1 to 5 minutes on 2 cores), ${constrained[*]:-unconstrained}" >&2
    "$venv/bin/python" -m pip install "${pip[@]}" "${constrained[@]}" -e "$root[test,trl,embeddings]"
    echo "bootstrap:       done in $((SECONDS - step)) s" >&2
    rm -f "$venv"/.transformers-tpu-ext-*
    touch "$stamp"
    echo "bootstrap: ready in $((SECONDS - started)) s" >&2
fi
echo "$venv"
