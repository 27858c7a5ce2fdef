#!/usr/bin/env bash
# The `jax` extra: JAX's ragged paged attention kernel on the serving path (docs/serving.md, "The
# attention kernel") and its megablox grouped matmul for mixture-of-experts layers (docs/mixture-of-experts.md),
# on the simulated TPU (its torch.tpu.pallas.jax_op runs the kernel's reference).
#
# Installs this package's `jax` extra (JAX 0.10 with jaxlib, about 600 MB) into the Python given by
# $PYTHON (default: the repo's .venv, which already holds the test extras), unless it is there, checks
# that the installed JAX is in the supported range and has the kernel, then runs the tests that need
# it (they skip without JAX in the main suite). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
pins="${PIP_CONSTRAINTS:-$root/constraints.txt}"  # the tested set (scripts/bootstrap.sh)

started=$SECONDS
if ! "$python" -c "import jax.experimental.pallas.ops.tpu.ragged_paged_attention" 2>/dev/null; then
    echo "check_jax: installing transformers-tpu-ext[jax] into $("$python" -c 'import sys; print(sys.prefix)')" >&2
    "$python" -m pip install --quiet --disable-pip-version-check ${pins:+-c "$pins"} -e "$root[jax]"
fi
"$python" - <<'PY'
import importlib, inspect, sys
from importlib import metadata

from transformers_tpu_ext.serving import kernel_path

version = metadata.version("jax")
module = importlib.import_module(kernel_path.KERNEL)
args = tuple(inspect.signature(module.ragged_paged_attention).parameters)
facts = kernel_path.KernelFacts(jax=version, kernel_args=args, jax_op=True, head_dim=128, heads=8, kv_heads=2)
path, why = kernel_path.attention_path(facts)
if path != "ragged":
    sys.exit(f"check_jax: JAX {version}: {why}")
print(f"check_jax: JAX {version} (jaxlib {metadata.version('jaxlib')}): {why}", file=sys.stderr)
PY
echo "check_jax: JAX ready in $((SECONDS - started)) s" >&2

cd "$root"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The kernel's reference runs op by op on JAX's CPU backend; unoptimized XLA programs compile faster. One worker
# per core, a file's tests on one worker (8 min on 2 cores; 33 min in one process).
export XLA_FLAGS="${XLA_FLAGS:---xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true}"
"$python" -m pytest -n auto --dist loadfile -q -p no:cacheprovider \
    tests/simulator/test_pallas.py tests/simulator/test_jax_op_wheel.py tests/serving/test_kernel_path.py \
    tests/serving/test_ragged_serving.py tests/serving/test_ragged_formats.py tests/serving/test_ragged_fallback.py \
    tests/simulator/test_megablox.py tests/experts "$@"
echo "check_jax: passed in $((SECONDS - started)) s" >&2
