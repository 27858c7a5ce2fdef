#!/usr/bin/env bash
# The "newest" stage: the newest release of every dependency and extra, as a user who installs today gets
# them, against the fast suite and the demo. The main suite runs the tested set (constraints.txt); this stage
# is how CI learns first that a release from this morning breaks a patch.
#
# Resolves, with no constraints file, in .venv-newest/ (kept between runs; every run asks the package index
# for newer releases): torch, the newest in the supported range (a CUDA build from the package index on Linux,
# run on the CPU), then this package with every extra (test, trl, embeddings, jax, lm-eval, serve, vision:
# Transformers, Accelerate, PEFT, TRL, sentence-transformers, lm-eval, JAX in their ranges). Prints what it
# resolved and which releases are newer than constraints.txt, runs `pytest -m "not slow"` and the demo, and
# on a failure names the newer releases, the patches that stood aside, and the capabilities (with their
# patches) whose tests failed (scripts/newest_report.py). Extra arguments go to pytest.
#
#   bash scripts/newest.sh
#   NEWEST_PREPARE_ONLY=1 bash scripts/newest.sh   # only resolve and install (.ci/run does it in the background)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
venv="${TRANSFORMERS_TPU_EXT_NEWEST_VENV:-$root/.venv-newest}"
extras="test,trl,embeddings,jax,lm-eval,serve,vision"
pip=(--quiet --disable-pip-version-check)
# The machine's pip cap (/etc/xdg/pip: torch<=2.14.1) would hide the newest torch: this stage is about the newest.
export PIP_CONSTRAINT=/dev/null

torch_range="$(grep -E '^torch[<>=!~ ]' "$root/transformers_tpu_ext/requirements.txt")"
started=$SECONDS
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
echo "newest: [1/2] the newest $torch_range (a CUDA build from the package index: about 3 GB when it is new)" >&2
"$venv/bin/python" -m pip install "${pip[@]}" --upgrade "$torch_range"
echo "newest: [2/2] the newest releases of transformers-tpu-ext[$extras] ($((SECONDS - started)) s so far)" >&2
"$venv/bin/python" -m pip install "${pip[@]}" --upgrade --upgrade-strategy eager "$torch_range" -e "$root[$extras]"
"$venv/bin/python" -m pip freeze --exclude-editable >"$venv/resolved.txt"
echo "newest: venv ready in $((SECONDS - started)) s" >&2
if [ -n "${NEWEST_PREPARE_ONLY:-}" ]; then
    exit 0
fi

report=("$venv/bin/python" "$root/scripts/newest_report.py" --resolved "$venv/resolved.txt" --constraints "$root/constraints.txt")
"${report[@]}" resolved >&2

cd "$root"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TRANSFORMERS_TPU_EXT_DISABLE TRANSFORMERS_TPU_EXT_SIMULATE
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
status=0
"$venv/bin/python" -m pytest -n auto --dist loadfile --no-loadscope-reorder -q -p no:cacheprovider -m "not slow" \
    --junitxml "$results/junit.xml" "$@" || status=1
if ! "$venv/bin/transformers-tpu" demo >"$results/demo.txt" 2>&1; then
    status=1
    echo "newest: transformers-tpu demo FAILED:" >&2
    tail -n 20 "$results/demo.txt" >&2
else
    echo "newest: transformers-tpu demo passed ($(grep -m1 'ran on' "$results/demo.txt" || true))" >&2
fi
TRANSFORMERS_TPU_EXT_SIMULATE=1 "$venv/bin/transformers-tpu" doctor --json >"$results/doctor.json" 2>/dev/null || true
if [ $status -ne 0 ]; then
    "${report[@]}" failed --junit "$results/junit.xml" --doctor "$results/doctor.json" >&2
    exit 1
fi
"${report[@]}" passed --doctor "$results/doctor.json" >&2
