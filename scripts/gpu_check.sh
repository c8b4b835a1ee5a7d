#!/usr/bin/env bash
# GPU readiness in a few minutes: the tests marked `gpu`, a short bf16-mixed training run, the
# training-loop benchmark (bare step vs real loop, per precision) and a decoding benchmark,
# then ONE table. Without CUDA every part that needs it says so and the rest runs on the CPU
# (bf16-mixed training on the CPU, the benchmarks in --quick sizes), so the script itself
# stays tested (tests/integration/test_gpu_check.py).
#
#   scripts/gpu_check.sh                 # on a GPU machine; the table also goes to $OUT_DIR
#   OUT_DIR=/tmp/gc scripts/gpu_check.sh # where the logs, JSON and table go (default gpu_check/)
#   PYTHON=.venv/bin/python scripts/gpu_check.sh
#
# Exit status: 0 when every part passed or was skipped for a stated reason, 1 otherwise.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
OUT_DIR="${OUT_DIR:-$ROOT/gpu_check}"
mkdir -p "$OUT_DIR"
ROWS="$OUT_DIR/rows.tsv"
: >"$ROWS"
failed=0

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$ROWS"; }  # part, status, seconds, result

CUDA_NAME="$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)"
CPU_NAME="$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
if [ -n "$CUDA_NAME" ]; then
    DEVICE=gpu
    QUICK=()
else
    DEVICE=cpu
    QUICK=(--quick)
fi
NO_CUDA="no CUDA device (torch.cuda.is_available() is False)"

# 1. Tests marked `gpu` (they skip themselves, with the reason, without CUDA).
start=$SECONDS
"$PYTHON" -m pytest -q -m gpu -rs -p no:cacheprovider tests >"$OUT_DIR/gpu_tests.log" 2>&1
rc=$?
summary="$(tail -1 "$OUT_DIR/gpu_tests.log" | tr -d '=' | sed 's/^ *//;s/ *$//')"
if [ $rc -eq 0 ]; then
    if [ "$DEVICE" = cpu ]; then row "gpu tests" skipped $((SECONDS - start)) "$summary: $NO_CUDA"
    else row "gpu tests" passed $((SECONDS - start)) "$summary"; fi
else
    row "gpu tests" FAILED $((SECONDS - start)) "$summary (see gpu_tests.log)"; failed=1
fi

# 2. A short bf16-mixed training run through train.py (tiny model, generated data).
start=$SECONDS
RUN_DIR="$OUT_DIR/bf16_run"
rm -rf "$RUN_DIR"
# No validation (check_val_every_n_epoch past the end); the test split scores the last weights.
"$PYTHON" train.py "trainer=$DEVICE" trainer.precision=bf16-mixed trainer.max_steps=60 \
    trainer.max_epochs=100 trainer.check_val_every_n_epoch=1000 trainer.limit_test_batches=2 \
    trainer.log_every_n_steps=10 trainer.enable_progress_bar=false callbacks=none logger=csv \
    data.sizes.train=3000 data.sizes.validation=100 data.sizes.test=100 data.cache_dir=null \
    "hydra.run.dir=$RUN_DIR" >"$OUT_DIR/bf16_run.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    result="$("$PYTHON" - "$RUN_DIR/csv/metrics.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tps = [float(r["train/tokens_per_sec"]) for r in rows if r.get("train/tokens_per_sec")]
loss = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
print(f"loss {loss[0]:.2f} -> {loss[-1]:.2f}, {tps[-1]:,.0f} target tok/s" if tps else "no metrics")
EOF
)"
    where=$([ "$DEVICE" = cpu ] && echo " (on the CPU: $NO_CUDA)" || echo "")
    row "bf16-mixed training" passed $((SECONDS - start)) "$result$where"
else
    row "bf16-mixed training" FAILED $((SECONDS - start)) "exit $rc (see bf16_run.log)"; failed=1
fi

# 3. Training-loop benchmark: bare step vs the real Trainer loop, fp32 and bf16-mixed.
start=$SECONDS
"$PYTHON" scripts/benchmark.py loop --accelerator "$DEVICE" --precisions 32-true bf16-mixed \
    --steps 12 --warmup 3 --repeats 2 --data generated "${QUICK[@]}" \
    --out "$OUT_DIR/loop.json" >"$OUT_DIR/loop.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    result="$("$PYTHON" - "$OUT_DIR/loop.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("; ".join(
    f"{x['contender']} {x['precision']} {x['tokens_per_s']:,.0f} tok/s"
    + (f" ({x['vs_bare_same_precision']:.2f}x bare)" if "vs_bare_same_precision" in x else "")
    for x in r["rows"]
))
EOF
)"
    tag=$([ "$DEVICE" = cpu ] && echo " [CPU, --quick sizes: $NO_CUDA]" || echo "")
    row "training benchmark" passed $((SECONDS - start)) "$result$tag"
else
    row "training benchmark" FAILED $((SECONDS - start)) "exit $rc (see loop.log)"; failed=1
fi

# 4. Decoding benchmark: greedy and beam 5 on the device, small model, random weights.
start=$SECONDS
"$PYTHON" - "$DEVICE" "${QUICK[@]}" >"$OUT_DIR/decode.log" 2>&1 <<'EOF'
import sys, time
import torch
from transformer_mt.inference.search import SearchConfig, search_batch
from transformer_mt.model.transformer import ModelConfig, Transformer

device = torch.device("cuda" if sys.argv[1] == "gpu" else "cpu")
quick = "--quick" in sys.argv
torch.manual_seed(0)
size = dict(d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1) if quick \
    else dict(d_model=256, n_heads=8, d_ff=512, n_encoder_layers=3, n_decoder_layers=3)
config = ModelConfig(src_vocab_size=6000, tgt_vocab_size=6000, pad_id=0, dropout=0.0, **size)
model = Transformer(config).to(device).eval()
batch, length = (8, 12) if quick else (128, 24)
src = torch.randint(4, 6000, (batch, length), device=device)
parts = []
for beam in (1, 5):
    search = SearchConfig(beam_size=beam, max_len_a=0.0, max_len_b=length)
    with torch.inference_mode():
        search_batch(model, src, bos_id=1, eos_id=2, search=search)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(3):
            search_batch(model, src, bos_id=1, eos_id=2, search=search)
        if device.type == "cuda":
            torch.cuda.synchronize()
    parts.append(f"beam {beam}: {3 * batch / (time.perf_counter() - start):,.0f} sent/s")
print(f"{'; '.join(parts)} ({batch} x {length} tokens, d_model {config.d_model})")
EOF
rc=$?
if [ $rc -eq 0 ]; then
    tag=$([ "$DEVICE" = cpu ] && echo " [CPU, --quick sizes: $NO_CUDA]" || echo "")
    row "decoding benchmark" passed $((SECONDS - start)) "$(tail -1 "$OUT_DIR/decode.log")$tag"
else
    row "decoding benchmark" FAILED $((SECONDS - start)) "exit $rc (see decode.log)"; failed=1
fi

# The one table.
{
    echo "GPU check: ${CUDA_NAME:-no GPU} | CPU: ${CPU_NAME:-unknown} | $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "| part | status | s | result |"
    echo "|---|---|---|---|"
    while IFS=$'\t' read -r part status seconds result; do
        echo "| $part | $status | $seconds | $result |"
    done <"$ROWS"
} | tee "$OUT_DIR/table.md"
exit $failed
