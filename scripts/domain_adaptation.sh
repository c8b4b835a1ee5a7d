#!/usr/bin/env bash
# Domain adaptation with init_from: a Multi30k de->en checkpoint (image captions) fine-tuned on a
# new domain, the embedded generated sentences with numbers (German -> English), then both test
# sets scored before and after: what the new domain gains and what the old one forgets.
#   bash scripts/domain_adaptation.sh CKPT [OUT]        # ~15 min on 2 cores
# Env: MINUTES (fine-tuning budget, default 4), TRAIN (generated training pairs, default 2000),
# FREEZE (e.g. "[embeddings,encoder]"; default: nothing frozen), DATA_DIR (Multi30k files).
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=${1:?usage: scripts/domain_adaptation.sh CKPT [OUT]}
out=${2:-outputs/domain_adaptation}
PY=${PY:-.venv/bin/python}
DATA_DIR=${DATA_DIR:-../shared/data/multi30k}
MINUTES=${MINUTES:-4}
TRAIN=${TRAIN:-2000}
FREEZE=${FREEZE:-[]}

# The new domain: its test split depends on the sizes, so every command names the same ones.
numbers=(data=numbers data.src_lang=de data.tgt_lang=en "data.sizes.train=$TRAIN"
         data.sizes.validation=200 data.sizes.test=500)
multi30k=(data=multi30k data.source=files "data.dir=$DATA_DIR" data.src_lang=de data.tgt_lang=en)
quiet=(progress=false decoding.beam_size=1)

evaluate() {  # evaluate NAME CKPT DATA...: greedy BLEU of CKPT on DATA's test split
  local name=$1 model=$2
  shift 2
  $PY evaluate.py ckpt_path="$model" "${quiet[@]}" "$@" hydra.run.dir="$out/eval/$name"
}

evaluate before-multi30k "$ckpt" "${multi30k[@]}"
evaluate before-numbers "$ckpt" "${numbers[@]}"

# A fresh optimizer, a short warmup and a lower peak: the weights only need to move a little.
$PY train.py init_from="$ckpt" "${numbers[@]}" "freeze=$FREEZE" \
    optimizer.lr=3e-4 module.warmup_steps=50 module.lr_schedule=linear \
    trainer.max_epochs=null "trainer.max_time=00:00:$(printf %02d "$MINUTES"):00" \
    callbacks.progress_bar=null test_after_fit=false hydra.run.dir="$out/finetune"
tuned=$($PY -c 'import sys
from transformer_mt.inference.averaging import select_checkpoints
print(select_checkpoints(sys.argv[1], 1, "best")[0])' "$out/finetune")  # by val/bleu

evaluate after-multi30k "$tuned" "${multi30k[@]}"
evaluate after-numbers "$tuned" "${numbers[@]}"

$PY - "$out/eval" <<'EOF'
import json, sys
from pathlib import Path
rows = {p.name: json.loads((p / "results.json").read_text()) for p in Path(sys.argv[1]).iterdir()}
print("| model | Multi30k test2016 BLEU | numbers test BLEU |\n|---|---|---|")
for when in ("before", "after"):
    bleu = [rows[f"{when}-{d}"]["metrics"]["bleu"] for d in ("multi30k", "numbers")]
    print(f"| {when} fine-tuning | {bleu[0]:.2f} | {bleu[1]:.2f} |")
EOF
