#!/usr/bin/env bash
# The compatibility matrix: the oldest releases of every supported range (transformers_tpu_ext/requirements.txt,
# "# tested:" lines), next to the main suite (scripts/test.sh: the tested set of constraints.txt, torch 2.13.0)
# and the "newest" stage (scripts/newest.sh: whatever the package index offers today). CI runs all three
# (.ci/run).
#
# Each combination gets its own venv under .venv-matrix/<name>/ (reused while the pins and the
# package's declared dependencies are unchanged). The pins are installed *together with* the
# package, so pip refuses a combination outside the supported ranges: the matrix can only prove
# what the package claims. Each combination runs the compatibility subset below: every test that
# exercises a patch against the installed Transformers/Accelerate, the simulated TPU against the
# installed torch, and the settings, in-process (-m "not slow"); the whole suite runs once, in
# scripts/test.sh. Extra arguments go to pytest.
#
#   bash scripts/matrix.sh                         # every combination
#   MATRIX_ONLY=oldest bash scripts/matrix.sh
#   MATRIX_PREPARE_ONLY=1 bash scripts/matrix.sh   # only create the venvs (.ci/run does it while the
#                                                  # main suite runs: mostly downloads)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
cache="${TRANSFORMERS_TPU_EXT_MATRIX_DIR:-$root/.venv-matrix}"

# name | pins (torch first: it is installed alone, then the rest with the package)
COMBINATIONS=(
    "oldest|torch==2.11.0 transformers==5.23.0 accelerate==1.1.0 wrapt==1.16.0"
    "middle|torch==2.13.0 transformers==5.24.0 accelerate==1.16.0 wrapt==2.5.2"
)
COMPAT_TESTS=(
    tests/core/test_activation.py tests/core/test_backend.py tests/core/test_compat.py tests/cli/test_doctor.py
    tests/core/test_faults.py tests/generation/test_generation.py tests/kernels/test_kernels.py tests/placement/test_pipeline_device.py
    tests/placement/test_placement.py tests/core/test_settings.py tests/simulator/test_simulated_tpu.py tests/simulator/test_tiny.py
    tests/parallelism/test_tp_patch.py tests/generation/test_device_loop_release.py tests/core/test_relies.py
)

# torch above the machine's pip cap (/etc/xdg/pip: torch<=2.14.1) is pinned exactly here, so lifting
# the cap for these installs cannot pull an unexpected (multi-GB) build.
export PIP_CONSTRAINT=/dev/null
mkdir -p "$cache"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

selected=()
for combination in "${COMBINATIONS[@]}"; do
    name="${combination%%|*}"
    if [ -z "${MATRIX_ONLY:-}" ] || [ "$MATRIX_ONLY" = "$name" ]; then
        selected+=("$combination")
    fi
done

# Create (or reuse) the venv of one combination; prints what it did on stderr.
prepare() {
    local name="$1" pins="$2" venv="$cache/$1" started=$SECONDS
    local torch_pin="${pins%% *}"
    local stamp
    stamp="$venv/.matrix-$(printf '%s\n' "$pins" | cat - "$root/pyproject.toml" "$root/transformers_tpu_ext/requirements.txt" | sha256sum | cut -c1-16)"
    if [ -f "$stamp" ]; then
        return 0
    fi
    rm -rf "$venv"
    "$python" -m venv "$venv"
    echo "matrix[$name]: [1/2] installing $torch_pin (a CUDA build from the package index: about 3 GB, a few minutes)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin"
    echo "matrix[$name]: [2/2] installing ${pins#* } and transformers-tpu-ext[test] ($((SECONDS - started)) s so far)" >&2
    # shellcheck disable=SC2086 # the pins are words
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $pins -e "$root[test]"
    touch "$stamp"
    echo "matrix[$name]: venv ready in $((SECONDS - started)) s" >&2
}

if [ -n "${MATRIX_PREPARE_ONLY:-}" ]; then
    for combination in "${selected[@]}"; do
        IFS='|' read -r name pins <<<"$combination"
        prepare "$name" "$pins"
    done
    exit 0
fi

# The next combination's venv is prepared (mostly download and unpacking) while this one's tests
# run (mostly one core): on 2 cores that overlaps most of an install.
summary=()
status=0
next_pid=""
next_log="$cache/.prepare.log"
if [ ${#selected[@]} -gt 0 ]; then
    IFS='|' read -r name pins <<<"${selected[0]}"
    prepare "$name" "$pins"
fi
for index in "${!selected[@]}"; do
    IFS='|' read -r name pins <<<"${selected[$index]}"
    if [ -n "$next_pid" ]; then
        if ! wait "$next_pid"; then
            cat "$next_log" >&2
            echo "matrix[$name]: preparing the venv FAILED" >&2
            exit 1
        fi
        cat "$next_log" >&2
        next_pid=""
    fi
    if [ $((index + 1)) -lt ${#selected[@]} ]; then
        IFS='|' read -r next_name next_pins <<<"${selected[$((index + 1))]}"
        prepare "$next_name" "$next_pins" >"$next_log" 2>&1 &
        next_pid=$!
    fi
    venv="$cache/$name"
    started=$SECONDS
    installed=$("$venv/bin/python" -c 'from importlib.metadata import version as v; print(*(f"{d}=={v(d)}" for d in ("torch", "transformers", "accelerate", "wrapt")))')
    echo "matrix[$name]: $installed; running the compatibility subset" >&2
    if (cd "$root" && MATRIX_COMBINATION="$name" "$venv/bin/python" -m pytest -n auto --dist loadfile -q -p no:cacheprovider -m "not slow" "${COMPAT_TESTS[@]}" "$@"); then
        result=passed
    else
        result=FAILED
        status=1
    fi
    summary+=("matrix[$name]: $result in $((SECONDS - started)) s ($installed)")
done
printf '%s\n' "${summary[@]}" >&2
exit $status
