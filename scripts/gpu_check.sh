#!/usr/bin/env bash
# The one prepared GPU check, for when a CUDA device is lent: the gpu-marked smoke tests (every native family
# against transformers on CUDA, the fallback on CUDA, sampled and greedy serving, TP over NCCL with two GPUs),
# then the decode benchmark on CUDA with the 100M Llama against transformers. Bounded: about 8 minutes.
#
#   scripts/gpu_check.sh            # results on stdout, logs under ${OUT:-var/gpu-check}
#   PY=/path/to/python scripts/gpu_check.sh
#
# On a device image without this project's environment (its own python3 with torch and transformers, no
# Django): wheels in var/gpu-wheels (made here with `pip download --no-deps -d var/gpu-wheels starlette
# uvicorn`, carried along) are installed when those imports are missing, and pytest runs without the portal's
# conftest (the smoke tests need none of its fixtures).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LOGS=${OUT:-var/gpu-check}
mkdir -p "$LOGS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
start=$(date +%s)

if ! "$PY" -c "import starlette, uvicorn" 2>/dev/null && ls var/gpu-wheels/*.whl >/dev/null 2>&1; then
  echo "== installing the carried wheels: $(ls var/gpu-wheels)"
  "$PY" -m pip install -q --no-index --no-deps var/gpu-wheels/*.whl || true
fi

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
if ! "$PY" - <<'PY'
import importlib.util, sys
import torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
missing = [m for m in ("transformers", "tokenizers", "safetensors", "starlette", "uvicorn", "httpx", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    print("missing packages:", ", ".join(missing))
sys.exit(0 if torch.cuda.is_available() else 1)
PY
then
  echo "RESULT: no usable CUDA environment (see above)"; exit 2
fi

echo "== test models (built once, cached under var/test-models)"
timeout 120 "$PY" -c "
from agents.runtime.testing.make_model import cached_model
for arch in ('llama', 'qwen3', 'mixtral', 'qwen3-moe', 'deepseek-v3'):
    print(arch, cached_model(arch))
" 2>&1 | tail -5

echo "== gpu smoke tests"
PYTHONPATH=. timeout 330 "$PY" -m pytest -q -m gpu -p no:cacheprovider -p no:django --noconftest \
  -o addopts="" --timeout 300 tests/runtime/test_gpu_smoke.py \
  2>&1 | tee "$LOGS/gpu_smoke.log" | tail -25
tests=${PIPESTATUS[0]}

echo "== decode benchmark on CUDA (llama-100m, tiny mixtral) vs transformers"
left=$(( 470 - ($(date +%s) - start) ))
if [ "$left" -gt 60 ]; then
  timeout "$left" "$PY" benchmarks/runtime_decode.py --device cuda --tokens 128 2>&1 \
    | grep -v "^Loading weights" | tee "$LOGS/runtime_decode.log" | tail -20
  bench=${PIPESTATUS[0]}
else
  echo "skipped: ${left}s left of the 8-minute budget"; bench=124
fi

echo "== summary: smoke tests exit ${tests}, benchmark exit ${bench}, $(( $(date +%s) - start ))s"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
