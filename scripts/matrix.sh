#!/usr/bin/env bash
# The compatibility matrix: the test suite against other releases of Transformers, Accelerate and
# wrapt than the newest ones `scripts/test.sh` gets (CI runs both, see .ci/run).
#
# Each combination gets its own venv under .venv-matrix/<name>/ (reused while the pins and the
# package's declared dependencies are unchanged). The pins are installed *together with* the
# package, so pip refuses a combination outside the ranges in transformers_tpu_ext/requirements.txt:
# the matrix can only prove what the package claims. Extra arguments go to pytest.
#
#   bash scripts/matrix.sh                 # every combination
#   MATRIX_ONLY=oldest bash scripts/matrix.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
torch_pin="${TORCH_PIN:-torch==2.13.0}"
cache="${TRANSFORMERS_TPU_EXT_MATRIX_DIR:-$root/.venv-matrix}"

# name | pins | tests: "all" (the whole suite) or "fast" (-m "not slow": no subprocess/multi-process tests)
# The oldest release of every range runs the whole suite; the newest of everything is scripts/test.sh.
# (Transformers 5.23 is not supported: its pipeline() leaves pipe.device on CPU for a model that
# device_map="auto" put on the TPU.)
COMBINATIONS=(
    "oldest|transformers==5.24.0 accelerate==1.1.0 wrapt==1.16.0|all"
    "newest-wrapt-1|transformers==5.24.0 accelerate==1.15.0 wrapt==1.17.3|fast"
    "oldest-wrapt-2|transformers==5.24.0 accelerate==1.1.0 wrapt==2.0.0|fast"
)

mkdir -p "$cache"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
summary=()
status=0
for combination in "${COMBINATIONS[@]}"; do
    IFS='|' read -r name pins tests <<<"$combination"
    if [ -n "${MATRIX_ONLY:-}" ] && [ "$MATRIX_ONLY" != "$name" ]; then
        continue
    fi
    venv="$cache/$name"
    stamp="$venv/.matrix-$(printf '%s\n' "$torch_pin $pins" | cat - "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" | sha256sum | cut -c1-16)"
    started=$SECONDS
    if [ ! -f "$stamp" ]; then
        echo "matrix[$name]: installing $torch_pin, $pins and transformers-tpu-ext[test] into $venv" >&2
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin"
        # shellcheck disable=SC2086 # the pins are words
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins -e "$root[test]"
        touch "$stamp"
    fi
    installed=$("$venv/bin/python" -c 'from importlib.metadata import version as v; print(*(f"{d}=={v(d)}" for d in ("torch", "transformers", "accelerate", "wrapt")))')
    selection=()
    if [ "$tests" = fast ]; then
        selection=(-m "not slow")
    fi
    echo "matrix[$name]: $installed; tests: $tests" >&2
    if (cd "$root" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "${selection[@]}" "$@"); then
        result=passed
    else
        result=FAILED
        status=1
    fi
    summary+=("matrix[$name]: $result in $((SECONDS - started)) s ($installed)")
done
printf '%s\n' "${summary[@]}" >&2
exit $status
