#!/usr/bin/env bash
# Reproduce the README's results table and benchmark tables on this machine (CPU, 2 cores).
#   bash scripts/reproduce.sh            # everything: ~2 h 15 min (two 60-minute trainings)
#   bash scripts/reproduce.sh de_en      # one direction: ~65 min
# Each training is a 60-minute wall-clock budget (trainer.max_time in the presets): on a slower
# machine it runs fewer epochs but still ends annealed, validated and tested inside the hour;
# tokenizer training (~1 min) before and evaluation (a few minutes) after come on top.
# Needs the Multi30k files at ../shared/data/multi30k (or set DATA_DIR). The trainings are
# pinned to fp32, as the README's rows are; each record gets a name of its own
# (multi30k_<dir>_tiny_60_<date-time>), so the committed records are never replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
make setup
PY=.venv/bin/python
DATA_DIR=${DATA_DIR:-../shared/data/multi30k}
OUT=${OUT:-outputs/results}
directions=${1:-"de_en en_de"}
stamp=$(date +%Y%m%d-%H%M)

for d in $directions; do
  run="$OUT/multi30k_$d"
  $PY train.py experiment=multi30k_$d data.source=files data.dir="$DATA_DIR" \
      trainer.precision=32-true callbacks.progress_bar=null hydra.run.dir="$run"
  best=$($PY -c 'import sys
from transformer_mt.inference.averaging import select_checkpoints
print(select_checkpoints(sys.argv[1], 1, "best")[0])' "$run")  # by val/bleu
  $PY evaluate.py ckpt_path="$best" decoding.beam_size=1 hydra.run.dir="$run/eval/greedy"
  # Beam 5 with the length normalisation the preset stores (power; alpha 1.4 de-en, 1.0 en-de).
  $PY evaluate.py ckpt_path="$best" decoding.beam_size=5 hydra.run.dir="$run/eval/beam5"
  # A record in docs/runs/ beside the ones the README's rows cite, to compare with them.
  $PY scripts/record_run.py "$run" --name "multi30k_${d}_tiny_60_$stamp" \
      --eval greedy="$run/eval/greedy/results.json" --eval beam5="$run/eval/beam5/results.json"
done

$PY scripts/benchmark.py all --format markdown --plot --out-dir bench_results
