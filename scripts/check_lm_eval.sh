#!/usr/bin/env bash
# The `lm-eval` extra: lm-eval's `--model hf` on the simulated TPU (docs/inference.md, "lm-eval").
#
# Installs this package's `lm-eval` extra (lm-eval 0.4 with evaluate, nltk, sacrebleu, rouge-score,
# lxml, aiohttp...: about 37 packages, 155 MB) into the Python given by $PYTHON (default: the repo's
# .venv, which already holds the test extras), unless it is there, checks that the installed lm-eval
# is a release the plugin knows (transformers_tpu_ext.inference.policy.LM_EVAL_SUPPORTED), then runs
# the tests that need it (they skip without lm-eval in the main suite). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
pins="${PIP_CONSTRAINTS:-$root/constraints.txt}"  # the tested set (scripts/bootstrap.sh)

started=$SECONDS
if ! "$python" -c "import lm_eval.models.huggingface" 2>/dev/null; then
    echo "check_lm_eval: installing transformers-tpu-ext[lm-eval] into $("$python" -c 'import sys; print(sys.prefix)')" >&2
    "$python" -m pip install --quiet --disable-pip-version-check ${pins:+-c "$pins"} -e "$root[lm-eval]"
fi
"$python" - <<'PY'
import sys
from importlib import metadata

from transformers_tpu_ext.inference import policy

version = metadata.version("lm_eval")
why = policy.lm_eval_path(version, backend="causal", model_device="tpu")
if why is not None:
    sys.exit(f"check_lm_eval: {why}")
print(f"check_lm_eval: lm-eval {version}: HFLM's forward passes are bucketed on TPU", file=sys.stderr)
PY
echo "check_lm_eval: lm-eval ready in $((SECONDS - started)) s" >&2

cd "$root"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$python" -m pytest -n 0 -q -p no:cacheprovider tests/inference/test_lm_eval.py tests/inference/test_inference_policy.py "$@"
echo "check_lm_eval: passed in $((SECONDS - started)) s" >&2
