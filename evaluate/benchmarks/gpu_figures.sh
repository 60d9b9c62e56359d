#!/usr/bin/env bash
# The GPU figures of the timings table, in the order they matter, inside one time budget:
#
#   bash evaluate/benchmarks/gpu_figures.sh LOG [BUDGET_SECONDS]      # default 900
#
# 1. grouped and bf16 training throughput (grouped_training.py: the demo's model, k = 1..16),
# 2. DDP over NCCL (ddp.py under torchrun, one process per GPU: the demo's step, the paper's
#    ResNet-50 step, plain and adversarial),
# 3. decoding (decode.py: PIL and tensor per host core, nvjpeg batched on the GPU),
# 4. the demo, then the replicated suite, each from an empty runs folder (under $TMPDIR).
# Each step has a time limit inside the budget; one that fails or runs out is logged with its
# exit status, and the next one runs. Everything goes into LOG; nothing else is written but the
# runs folders. Run it from the repository root on a machine with a CUDA GPU.
set -u
if [ $# -lt 1 ]; then echo "usage: bash $0 LOG [BUDGET_SECONDS]" >&2; exit 2; fi
LOG=$1; BUDGET=${2:-900}
START=$(date +%s)
export PYTHONUNBUFFERED=1
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())") || exit 1
if [ "$GPUS" -lt 1 ]; then
  echo "$0: torch sees no CUDA GPU here; these are the GPU figures (the CPU ones: each script's --help)" >&2
  exit 2
fi
RUNS=$(mktemp -d "${TMPDIR:-/tmp}/counteraudit-gpu-figures.XXXXXX")

step() {  # NAME LIMIT COMMAND...: the command under its limit (cut to what the budget leaves)
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if (( limit > left - 5 )); then limit=$(( left - 5 )); fi
  if (( limit < 10 )); then echo "== $name: skipped, $left s of the budget left" >>"$LOG"; return; fi
  echo "== $name (limit $limit s, $(date -u +%T)): $*" >>"$LOG"
  local started; started=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
  echo "== $name: exit $? after $(( ($(date +%s%N) - started) / 1000000 )) ms" >>"$LOG"
}

{ date -u; git rev-parse --short HEAD 2>/dev/null; nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  lscpu | grep -E 'Model name|^CPU\(s\)'; grep -o -w 'avx2\|avx512f\|amx_tile' /proc/cpuinfo | sort | uniq -c
  python3 -c "import torch; print('torch', torch.__version__)"; } >>"$LOG" 2>&1
B=evaluate/benchmarks
RESNET50=(--architecture resnet50 --image-size 224 --batch-size 300 --num-classes 1000)
step grouped 150 python3 $B/grouped_training.py --device cuda --precision fp32 --precision bf16 \
  --step plain --step adversarial --k 1 --k 2 --k 4 --k 8 --k 16 --steps 10 --repeats 3
step ddp_small 45 python3 -m torch.distributed.run --nproc-per-node "$GPUS" $B/ddp.py --device cuda --repeats 5
step ddp_resnet50 60 python3 -m torch.distributed.run --nproc-per-node "$GPUS" $B/ddp.py --device cuda \
  "${RESNET50[@]}" --steps 5 --repeats 3
step ddp_resnet50_adversarial 75 python3 -m torch.distributed.run --nproc-per-node "$GPUS" $B/ddp.py \
  --device cuda "${RESNET50[@]}" --steps 3 --repeats 3 --step adversarial
step decode224 60 python3 $B/decode.py --images 192 --crop 224
step decode160 45 python3 $B/decode.py --images 192 --crop 160
step demo 100000 python3 evaluate/detect.py --runs-dir "$RUNS/demo" --no-progress
step replicated 100000 python3 evaluate/detect.py --suite replicated --runs-dir "$RUNS/replicated" --no-progress
echo "== trained models: $(find "$RUNS" -name metrics.json | wc -l) in $RUNS; total $(( $(date +%s) - START )) s" >>"$LOG"
