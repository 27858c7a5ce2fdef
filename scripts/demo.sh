#!/usr/bin/env bash
# Set up the local venv if needed, then run the guide's example (simulated TPU when there is no chip).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/bootstrap.sh")"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/transformers-tpu" demo "$@"
