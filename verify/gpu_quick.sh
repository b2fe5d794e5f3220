#!/usr/bin/env bash
# The one-GPU check in one command, for a machine with an NVIDIA GPU (even without internet):
#
#     bash verify/gpu_quick.sh [LOGS]        # LOGS: where the row logs go (default build/gpucheck)
#
# Uses $PYTHON (default: python3) as it is: a CUDA build of torch >= 2.13 and the course's
# packages must already be installed in it (`pip install -e ".[course]"`); it installs nothing.
# Prints the machine (nvidia-smi, d2lpar info), then each row of `verify/gpucheck.py --quick` as
# it finishes (344 s on one H200 on 2026-11-28, README "Verifying the course on a GPU machine"),
# then the table for the README: GPU, driver, torch, CUDA, rows.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOGS=${1:-build/gpucheck}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" D2LPAR_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
date -u '+%Y-%m-%d %H:%M UTC'
nvidia-smi || echo 'nvidia-smi: not found or failed'
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ['torch', 'torchvision', 'matplotlib', 'nbformat', 'nbclient', 'ipykernel', 'IPython']
print(' '.join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
    echo "gpu_quick: $PYTHON lacks: $missing. Install the course into it first: pip install -e '.[course]'"
    exit 4
fi
"$PYTHON" -m d2lpar info
# gpucheck stops by itself (exit 2 or 3, with the reason) when torch cannot use the GPU.
timeout --foreground -k 30 600 "$PYTHON" verify/gpucheck.py --quick --budget 450 --logs "$LOGS"
status=$?
echo "gpucheck --quick exit status: $status"
if [ -f "$LOGS/summary.tsv" ]; then  # `column` is missing from some minimal images
    if command -v column >/dev/null; then column -t -s $'\t' "$LOGS/summary.tsv"; else cat "$LOGS/summary.tsv"; fi
fi
exit $status
