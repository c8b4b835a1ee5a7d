#!/usr/bin/env bash
# Reproduce the README's results table and benchmark tables on this machine (CPU, 2 cores).
#   bash scripts/reproduce.sh            # everything: ~2 h 15 min (two 60-minute trainings)
#   bash scripts/reproduce.sh de_en      # one direction
# Needs the Multi30k files at ../shared/data/multi30k (or set DATA_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
make setup
PY=.venv/bin/python
DATA_DIR=${DATA_DIR:-../shared/data/multi30k}
OUT=${OUT:-outputs/results}
export OMP_WAIT_POLICY=PASSIVE
directions=${1:-"de_en en_de"}

for d in $directions; do
  run="$OUT/multi30k_$d"
  $PY train.py experiment=multi30k_$d data.source=files data.dir="$DATA_DIR" \
      callbacks.progress_bar=null threads=2 hydra.run.dir="$run"
  $PY scripts/average_checkpoints.py "$run" --last 5 -o "$run/checkpoints/averaged-last5.ckpt"
  best=$($PY -c 'import sys
from transformer_mt.inference.averaging import select_checkpoints
print(select_checkpoints(sys.argv[1], 1, "best")[0])' "$run")  # by val/bleu
  for ckpt in "$best" "$run/checkpoints/averaged-last5.ckpt"; do
    name=$(basename "$ckpt" .ckpt)
    $PY evaluate.py ckpt_path="$ckpt" decoding.beam_size=1 hydra.run.dir="$run/eval/$name-greedy"
    $PY evaluate.py ckpt_path="$ckpt" decoding.beam_size=5 decoding.length_penalty=0.6 \
        hydra.run.dir="$run/eval/$name-beam5"
  done
done

$PY scripts/benchmark.py all --format markdown --plot --out-dir bench_results
