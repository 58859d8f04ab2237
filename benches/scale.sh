#!/usr/bin/env bash
# benches/scale.sh: a billion-parameter training run on this machine with the optimizer state, the
# gradients and the parameters on NVMe (issue #13, item 3): time per step, peak RSS against the
# 2 GiB + 1 byte/parameter goal, NVMe bytes read and written per step, and the NVMe share of the step.
#
# Usage:  bash benches/scale.sh CONFIG NVME_DIR [STEPS]
#   CONFIG    a preset (gpt2-xl, ...) or a config.json (benches/scale/gpt2-3b.json: 3.03B parameters)
#   NVME_DIR  a directory on the NVMe drive (needs ~18 bytes per parameter free: fp32 master weights,
#             Adam m and v, the fp32 gradient accumulator, the bf16 working copy); emptied afterwards
#   STEPS     optimizer steps (default 3; the first pays for writing the initial state)
# Environment: ZS (a zerostream binary; default: build release), BATCH (1), SEQ (64), BUDGET (device
# memory budget; default 2 block slots' worth: the minimum `zerostream plan` prints), PRECISION (bf16),
# EXTRA (more train/plan flags, e.g. "--offload-gradients ram": the gradient accumulator in RAM).
# OUT: a directory that keeps the metrics (m.jsonl), /usr/bin/time's report and the log (default: a new
# temporary directory, printed at the end).
# Blocks recompute their activations in backward (--recompute), so the device part stays small.
# Prints the run's log and one table row per step; RSS is the process's VmHWM (peak) after each step.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:?usage: bash benches/scale.sh CONFIG NVME_DIR [STEPS]}
nvme=${2:?usage: bash benches/scale.sh CONFIG NVME_DIR [STEPS]}
steps=${3:-3}
batch=${BATCH:-1}
seq=${SEQ:-64}
precision=${PRECISION:-bf16}
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=${OUT:-$(mktemp -d)}
mkdir -p "$nvme" "$work"
trap 'rm -rf "$nvme"/rank*; echo "kept: $work"' EXIT

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM; load $(uptime | sed 's/.*load average: //')"
echo "== disk: $(df -h "$nvme" | tail -1)"
"$ZS" prepare --text examples/data/hamlet.txt --out "$work/hamlet.bin" > /dev/null
common=(--device cpu --config "$config" --data "$work/hamlet.bin" --batch-size "$batch" --seq-len "$seq"
  --precision "$precision" --recompute --offload-optimizer nvme --offload-params nvme --nvme-dir "$nvme" ${EXTRA:-})
if [ -z "${BUDGET:-}" ]; then
  # The smallest budget the plan accepts: two block slots.
  BUDGET=$( ("$ZS" plan "${common[@]}" --gpu-mem-budget 1 2>&1 || true) | sed -n 's/.*the minimum of \([0-9]*\) bytes.*/\1/p')
fi
# Exit 3: the plan exceeds this machine's RAM by its own count; the run below says whether it does.
"$ZS" plan "${common[@]}" --gpu-mem-budget "$BUDGET" || [ $? -eq 3 ]
# GNU time gives the peak RSS from outside; without it the metrics' peak_rss_bytes (VmHWM) still do.
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v -o "$work/time.txt")
"${timer[@]}" "$ZS" train "${common[@]}" --gpu-mem-budget "$BUDGET" --steps "$steps" \
  --warmup-steps 1 --sample-tokens 0 --eval-every 0 --metrics "$work/m.jsonl" 2>&1 | tee "$work/log.txt"
[ -f "$work/time.txt" ] && grep -E "Maximum resident|Elapsed" "$work/time.txt"
python3 - "$work/m.jsonl" <<'EOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "step" in r and "time" in r]
# The NVMe share of a step: the time the device thread waited for the host tiers (the AdamW sweep over
# NVMe it must not overtake, working-copy reads, gradient read-modify-writes), over the step's time.
print("| step | s/step | compute s | AdamW s | waited for NVMe/AdamW | NVMe read GB | NVMe written GB | NVMe GB/s over the step | peak RSS GiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    t = r["time"]
    rd, wr = r["nvme_read_bytes"], r["nvme_written_bytes"]
    waited = (t["io_wait_s"] + t["update_wait_s"]) / t["total_s"]
    print(f"| {r['step']} | {t['total_s']:.1f} | {t['device_compute_s']:.1f} | {t['adam_s']:.1f} | {100 * waited:.0f}% | {rd/1e9:.2f} | {wr/1e9:.2f} | "
          f"{(rd + wr) / 1e9 / t['total_s']:.2f} | {(r['peak_rss_bytes'] or 0) / 2**30:.2f} |")
EOF
