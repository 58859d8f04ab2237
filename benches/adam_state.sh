#!/usr/bin/env bash
# benches/adam_state.sh: --adam-state bf16 against fp32 (issue #23, item 4) on a small GPT-2 and a
# small Llama (benches/adam_state/*.json, ~0.8M parameters each, byte-level Hamlet): the training and
# validation loss after STEPS steps, side by side, with the curves drawn by `zerostream plot`; and the
# optimizer state's bytes per parameter each way on NVMe, as `plan` predicts them for GPT-2 1.5B with
# everything on NVMe, with and without --offload-gradients ram (tests/nvme_traffic.rs and
# tests/adam_state.rs hold real runs to these predictions to the byte).
#
# Usage:  bash benches/adam_state.sh [STEPS]      (default 300)
# Environment: ZS (a zerostream binary; default: build release), OUT (a directory that keeps the
# metrics, logs and SVGs; default: a new temporary directory, printed at the end), BETA2 (0.999: the
# value where bf16 moments are hardest, beta2 * v moving v by a quarter of bf16's ulp a step).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
beta2=${BETA2:-0.999}
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=${OUT:-$(mktemp -d)}
mkdir -p "$work"
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $("$ZS" --version)"
"$ZS" prepare --quiet --text examples/data/hamlet.txt --out "$work/hamlet.bin" --tokenizer bytes --val-fraction 0.1
echo
echo "| model | moments | loss at step $((steps - 1)) | validation loss | s/step | AdamW s/step |"
echo "|---|---|---|---|---|---|"
for model in gpt2 llama; do
  for state in fp32 bf16; do
    name="$model-$state"
    "$ZS" train --device cpu --config "benches/adam_state/$model-small-bytes.json" \
      --data "$work/hamlet.bin" --val-data "$work/hamlet.val.bin" --eval-every 50 \
      --batch-size 8 --seq-len 128 --steps "$steps" --lr 3e-3 --warmup-steps 30 --lr-schedule cosine \
      --beta2 "$beta2" --adam-state "$state" --sample-tokens 0 \
      --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1
    python3 - "$work/$name.jsonl" "$model" "$state" <<'PY'
import json, sys
every = [json.loads(l) for l in open(sys.argv[1])]
# The last row is the validation after the last step (final_validation): no training fields.
rows = [r for r in every if not r.get("final_validation")]
val = [r["val_loss"] for r in every if r.get("val_loss") is not None]
last = rows[-1]
mean = lambda k: sum(r["time"][k] for r in rows[1:]) / max(1, len(rows) - 1)
print(f"| {sys.argv[2]} | {sys.argv[3]} | {last['loss']:.4f} | {val[-1] if val else float('nan'):.4f} | {mean('total_s'):.3f} | {mean('adam_s'):.4f} |")
PY
  done
  "$ZS" plot --quiet -o "$work/$model-adam-state.svg" "$work/$model-fp32.jsonl" "$work/$model-bf16.jsonl"
done
echo
echo "== NVMe bytes per step, GPT-2 1.5B (gpt2-xl), B=1, T=64, bf16 working copy, everything on NVMe,"
echo "   two device block slots as benches/scale.sh runs it (plan's prediction):"
xl=(--config gpt2-xl --batch-size 1 --seq-len 64 --precision bf16 --recompute --offload-optimizer nvme --offload-params nvme --nvme-dir "$work/nvme")
budget=$( ("$ZS" plan "${xl[@]}" --gpu-mem-budget 1 2>&1 || true) | sed -n 's/.*the minimum of \([0-9]*\) bytes.*/\1/p')
for extra in "" "--offload-gradients ram"; do
  for state in fp32 bf16; do
    line=$("$ZS" plan "${xl[@]}" --gpu-mem-budget "$budget" --adam-state "$state" $extra 2>&1 | grep '^NVMe per step' || true)
    echo "  --adam-state $state ${extra:-(gradients on nvme)}: ${line#NVMe per step: }"
  done
done
echo "kept: $work"
