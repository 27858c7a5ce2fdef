#!/usr/bin/env bash
# Set up the local venv if needed, then run the test suite (extra arguments go to pytest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/bootstrap.sh")"
cd "$root"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Test files run side by side, one worker per core (pytest-xdist, "--dist loadfile": a file's tests stay on
# one worker, so its module fixtures are built once), the longest files first (tests/conftest.py orders
# them; "--no-loadscope-reorder" keeps that order). TRANSFORMERS_TPU_EXT_TEST_WORKERS=0 runs them all in
# this one process (a later -n on the command line also wins). -rfE names every failure and error.
exec "$venv/bin/python" -m pytest -n "${TRANSFORMERS_TPU_EXT_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder -rfE "$@"
