#!/usr/bin/env bash
# Every GPU check of the project in one run on one H200, most important first (the step limits add up to 570 s,
# under the 600 s of one device call; the device tool's 15 minutes also pay for the machine's start):
#
#   run(command="bash bench/gpu_all.sh", carry=[".whl", ".ref"], timeout_s=600)
#   run(command="ONLY=peer bash bench/gpu_all.sh", carry=[".ref"], timeout_s=300)   # one step by name
#
# .ref/module.py is the reference LeVJEPA code (MLO-lab/LeVJEPA module.py, CC BY-NC 4.0; ignored by git,
# never committed): bench/gpu_peer.py runs it beside levjepa. Without it the `peer` step says so and is skipped.
# onnxruntime-gpu (bench/gpu_deploy.py) is not on the image either: its wheel goes in .whl/ too.
#
# .whl holds the PyAV wheel for Python 3.12 (the GPU image has no PyAV): `python3 -m pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl av`.
# Each script saves its JSON as it goes; each has its own time limit so one slow part cannot eat the others.
set -u
OUT=${OUT:-${1:-gpu_out}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
LOG="$OUT/gpu_all.log"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
{
  date; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} >>"$LOG" 2>&1
step() {  # step NAME SECONDS COMMAND... (only the steps named in $ONLY when it is set)
  local name=$1 secs=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  echo "=== $name (limit ${secs}s) $(date +%T)" >>"$LOG"
  local t0=$SECONDS
  timeout "$secs" "$@" >>"$LOG" 2>&1
  echo "=== $name exit $? after $((SECONDS - t0))s" >>"$LOG"
}
REFERENCE=${REFERENCE:-$PWD/.ref/module.py}
export REFERENCE
# issue 47 first: the GPU tests of its paths, the reference code beside levjepa, SIGReg captured, the captured step
step pytest_gpu 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py tests/test_sigreg_impl.py tests/test_localreg.py tests/test_train_step.py
if [ -f "$REFERENCE" ]; then
  step peer 200 python3 bench/gpu_peer.py --reference "$REFERENCE" --out "$OUT" --budget-s 170
else
  echo "=== peer skipped: no reference module.py at $REFERENCE (set REFERENCE or carry .ref/)" >>"$LOG"
fi
step sigreg 50 python3 bench/gpu_sigreg.py --out "$OUT" --budget-s 35
step train_step 80 python3 bench/gpu_step.py --out "$OUT" --budget-s 65
step encoder 55 python3 bench/gpu_encoder.py --out "$OUT" --budget-s 40
step train 50 python3 bench/gpu_train.py --out "$OUT" --budget-s 40
step eval 35 python3 bench/gpu_eval.py --out "$OUT" --budget-s 28
step deploy 20 python3 bench/gpu_deploy.py --out "$OUT" --budget-s 15
step fp16 20 python3 -m levjepa pretrain --preset demo-cpu train.precision=fp16 train.device=cuda train.steps=30 train.eval_at_end=false --no-progress --run-dir "$OUT/fp16"  # loss scaling on a GPU
# by name only (ONLY=...): they do not fit the 600 s of one device call beside the others
[ -n "${ONLY:-}" ] && step data 30 python3 bench/gpu_data.py --out "$OUT" --budget-s 25
[ -n "${ONLY:-}" ] && step demo_sweep 110 python3 bench/demo_sweep.py --out "$OUT" --device cuda --jobs 4 --workers 3 --budget-s 60
echo "done $(date +%T)" >>"$LOG"
