#!/usr/bin/env bash
# benches/gpu-coop.sh: the cooperative-matrix matmul on a lent GPU, in four to six minutes (every part
# has a time limit, 345 s together at most), for a session with only a few minutes of device time left
# after benches/gpu.sh:
#   - `selftest --quick`: every kernel and cooperative-matrix variant against its twin on this adapter;
#   - `tune --models gpt2`: each cooperative-matrix class with every variant's time (the rows of
#     tune.out whose kind is coop_class; one line each in summary.txt);
#   - `bench kernels --only matmul` (GPT-2 124M and 1.5B): the f16-coop rows with the tuned variants (1.5B's
#     classes by the nearest tuned one), beside fp32;
#   - GPT-2 124M with `--matmul-inputs f16` (B=4, T=1024, random tokens), where the adapter allows it;
#   - Llama-3.2-1B fp32 with every block resident (its download seconds a step).
# Everything lands in ./gpu-coop-out and, packed for the device tool (which brings back at most 8 files),
# in $OUT/gpu-coop.tar.gz (./gpu-coop.tar.gz without $OUT).
#
# Usage:  bash benches/gpu-coop.sh      (after the Vulkan loader is unpacked, as benches/gpu.sh says)
# Environment: ZS (default .device/zerostream), TUNE_SECONDS (default 85).
set -uo pipefail
out=gpu-coop-out
rm -rf "$out" && mkdir -p "$out"
trap 'tar -czf "${OUT:-.}/gpu-coop.tar.gz" -C "$out" .' EXIT
trap 'exit 143' TERM INT
ZS=${ZS:-.device/zerostream} TUNE_SECONDS=${TUNE_SECONDS:-85}
case $TUNE_SECONDS in ''|*[!0-9]*) echo "benches/gpu-coop.sh: TUNE_SECONDS must be a whole number of seconds, got '$TUNE_SECONDS'" >&2; exit 2;; esac
TUNE_SECONDS=$((10#$TUNE_SECONDS))
[ -x "$ZS" ] || { echo "benches/gpu-coop.sh: no zerostream binary at $ZS (set ZS, or run benches/gpu-prepare.sh here first)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "benches/gpu-coop.sh: needs python3" >&2; exit 1; }
part() { # name limit command...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))" >&2
  timeout --signal=INT --kill-after=5 "$limit" "$@" >"$out/$name.out" 2>"$out/$name.err"
  echo "$name rc=$? $(date +%T)" | tee -a "$out/parts.txt" >&2
}
timeout 30 "$ZS" devices >"$out/devices.txt" 2>&1
part selftest 75 "$ZS" selftest --device gpu --quick --json
part tune $((TUNE_SECONDS + 15)) "$ZS" tune --json --models gpt2 --max-seconds "$TUNE_SECONDS"
part kernels 60 "$ZS" bench kernels --only matmul --json
# Random GPT-2 tokens (train needs --data with --config), as benches/gpu.sh makes them.
tokens=${TMPDIR:-/tmp}/zs-coop-tokens.bin
python3 -c "import random, array, sys; random.seed(1337); array.array('H', (random.randrange(50257) for _ in range(1 << 20))).tofile(open(sys.argv[1], 'wb'))" "$tokens"
if "$ZS" devices --json 2>/dev/null | grep -q '"matmul_f16_coop":true'; then
part train-f16 40 "$ZS" train --config gpt2 --data "$tokens" --device gpu --steps 6 --batch-size 4 --seq-len 1024 --warmup-steps 1 \
  --sample-tokens 0 --gpu-mem-budget 16GiB --matmul-inputs f16 --metrics "$out/train-f16.metrics"
else
  echo "train-f16 skipped: the adapter has no cooperative matrices zerostream can use" | tee -a "$out/parts.txt" >&2
fi
# Llama-3.2-1B with every block resident (fp32): its 232 MiB gradient read-backs are the case the spare
# read-back buffers (AllocCosts::spare_readback_bytes) are sized for; compare its download seconds with
# the oversized-resident run of benches/gpu.sh before that change (1.44 s a step on an H200).
part train-llama 70 "$ZS" train --config llama-3.2-1b --data "$tokens" --device gpu --steps 3 --batch-size 1 --seq-len 1024 --warmup-steps 1 \
  --sample-tokens 0 --gpu-mem-budget 60GiB --metrics "$out/train-llama.metrics"
# The cooperative-matrix classes: the best variant and every variant's time, one line each.
python3 - "$out/tune.out" <<'PY' | tee "$out/summary.txt"
import json, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"): continue
    try: r = json.loads(line)
    except ValueError: continue  # a line cut short by the time limit
    if r.get("kind") == "coop_class":
        every = ", ".join(f"{v['variant']} {v['seconds']*1e3:.3f}" for v in r["variants"])
        print(f"{r['class']} {r['shape']}: best {r['best']} {r['best_seconds']*1e3:.3f} ms ({r['best_gflops']:.0f} GFLOP/s); {every}")
    elif r.get("kind") == "summary":
        print("tune:", {k: r.get(k) for k in ("classes", "coop_classes", "seconds", "mismatched")})
PY
