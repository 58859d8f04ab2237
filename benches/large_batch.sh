#!/usr/bin/env bash
# benches/large_batch.sh: LAMB and LARS at 8x AdamW's batch (issue #24, item 2). A small GPT-2
# (benches/adam_state/gpt2-small-bytes.json, ~0.8M parameters) on byte-level Hamlet: AdamW at batch B
# for STEPS steps; then AdamW, LAMB and LARS at batch 8B for BIG_STEPS steps (warm-up a tenth of the
# steps, cosine to the end). For each run: the training loss (mean of the last 20 steps), the
# validation loss, and the first step whose trailing 20-step mean reaches AdamW-at-B's final one; the
# curves drawn by `zerostream plot`.
#
# Usage:  bash benches/large_batch.sh [STEPS [BIG_STEPS]]      (default 300 and 200)
# Environment: ZS (a zerostream binary; default: build release), OUT (a directory that keeps the
# metrics, logs and SVG; default: a new temporary directory, printed at the end), B (default 8),
# LR (AdamW's, default 3e-3), LAMB_LR (default 0.02; 0.1 diverged), LARS_LR (default 1), TRUST
# (LARS's eta, default 0.02). LAMB decays weights by 0.01 and LARS by 1e-4 (0.1, AdamW's, lets LARS's
# decay term swamp its gradient: it stalled at the unigram loss).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
big_steps=${2:-200}
b=${B:-8}
big=$((8 * b))
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=${OUT:-$(mktemp -d)}
mkdir -p "$work"
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $("$ZS" --version)"
"$ZS" prepare --quiet --text examples/data/hamlet.txt --out "$work/hamlet.bin" --tokenizer bytes --val-fraction 0.1
run() {
  local name=$1 n=$2
  shift 2
  "$ZS" train --device cpu --config benches/adam_state/gpt2-small-bytes.json \
    --data "$work/hamlet.bin" --val-data "$work/hamlet.val.bin" --eval-every 50 \
    --seq-len 128 --steps "$n" --warmup-steps $((n / 10)) --lr-schedule cosine --sample-tokens 0 \
    --metrics "$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1
}
run "adamw-b$b" "$steps" --batch-size "$b" --lr "${LR:-3e-3}"
run "adamw-b$big" "$big_steps" --batch-size "$big" --lr "${LR:-3e-3}"
run "lamb-b$big" "$big_steps" --batch-size "$big" --optimizer lamb --lr "${LAMB_LR:-0.02}" --weight-decay 0.01
run "lars-b$big" "$big_steps" --batch-size "$big" --optimizer lars --lr "${LARS_LR:-1}" --trust-coefficient "${TRUST:-0.02}" \
  --momentum 0.9 --weight-decay 0.0001
echo
python3 - "$work" "adamw-b$b" "adamw-b$big" "lamb-b$big" "lars-b$big" <<'PY'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
def every_row(n):
    return [json.loads(l) for l in open(f"{work}/{n}.jsonl")]
def rows(n):  # the steps' rows, not the validation after the last step (final_validation)
    return [r for r in every_row(n) if not r.get("final_validation")]
def trailing(losses, k=20):
    return [sum(losses[max(0, i - k + 1):i + 1]) / (i + 1 - max(0, i - k + 1)) for i in range(len(losses))]
base = trailing([r["loss"] for r in rows(names[0])])[-1]
print(f"target: {names[0]}'s final 20-step mean training loss, {base:.4f}")
print()
print("| run | tokens per step | loss (last 20 steps) | validation loss | steps to the target | s/step |")
print("|---|---:|---:|---:|---:|---:|")
for n in names:
    r = rows(n)
    t = trailing([x["loss"] for x in r])
    val = [x["val_loss"] for x in every_row(n) if x.get("val_loss") is not None]
    hit = next((i + 1 for i, x in enumerate(t) if x <= base), None)
    tokens = r[-1].get("tokens", "")
    mean = sum(x["time"]["total_s"] for x in r[1:]) / max(1, len(r) - 1)
    print(f"| {n} | {tokens} | {t[-1]:.4f} | {val[-1] if val else float('nan'):.4f} | {hit if hit else 'not reached'} | {mean:.3f} |")
PY
"$ZS" plot --quiet -o "$work/large-batch.svg" "$work/adamw-b$b.jsonl" "$work/adamw-b$big.jsonl" "$work/lamb-b$big.jsonl" "$work/lars-b$big.jsonl"
echo "kept: $work"
