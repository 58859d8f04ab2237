#!/usr/bin/env bash
# benches/gpu-f16.sh: issue #22 item 3 on a lent GPU with cooperative matrices, in about three minutes
# (every part has a time limit; together at most 560 s, under the device tool's 600 s a command):
# `selftest` (the cooperative-matrix matmul against its twin), `bench kernels` (its time beside the fp32
# kernel's), and GPT-2 124M and Llama-3.2-1B trained with fp32 and with `--matmul-inputs f16` from the same
# seed, so their losses and speeds sit side by side. Everything lands in ./gpu-f16-out and, packed for the
# device tool (which brings back at most 8 files), in $OUT/gpu-f16.tar.gz (./gpu-f16.tar.gz without $OUT).
#
# Usage:  bash benches/gpu-f16.sh      (after the Vulkan loader is unpacked, as benches/gpu.sh says)
# Environment: ZS (default .device/zerostream), TUNE_TABLE (a tuning file `zerostream tune` wrote on this
#              adapter, driver and zerostream version, under any name: copied into the tuning directory,
#              where the device finds it by its key, so the fp32 runs use tuned variants), STEPS
#              (default 20), LLAMA_STEPS (default 6).
set -uo pipefail
out=gpu-f16-out
rm -rf "$out" && mkdir -p "$out" # a warm machine keeps the folder between calls
# Packed however the script ends (done, a failed part, or a TERM or INT), so what was measured comes back.
trap 'tar -czf "${OUT:-.}/gpu-f16.tar.gz" -C "$out" .' EXIT
trap 'exit 143' TERM INT
ZS=${ZS:-.device/zerostream} STEPS=${STEPS:-20} LLAMA_STEPS=${LLAMA_STEPS:-6}
if [ -n "${TUNE_TABLE:-}" ]; then
  tune_dir=${ZEROSTREAM_TUNE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zerostream/tune}
  mkdir -p "$tune_dir" && cp "$TUNE_TABLE" "$tune_dir/" || exit 1
fi
log() { echo "== $* ($(date +%T))" | tee -a "$out/parts.txt" >&2; }
"$ZS" devices >"$out/devices.txt" 2>&1
log selftest
timeout 100 "$ZS" selftest --device gpu --json >"$out/selftest.jsonl" 2>"$out/selftest.err"
echo "selftest rc=$?" >>"$out/parts.txt"
log kernels
timeout 100 "$ZS" bench kernels --batch-size 4 --seq-len 1024 --json >"$out/kernels.jsonl" 2>"$out/kernels.err"
echo "kernels rc=$?" >>"$out/parts.txt"
python3 - "${TMPDIR:-/tmp}/zs-tokens.bin" <<'PY'
import random, sys, array
random.seed(1337)
array.array("H", (random.randrange(50257) for _ in range(1 << 20))).tofile(open(sys.argv[1], "wb"))
PY
train() { # name config batch steps [flags]
  local name=$1 config=$2 batch=$3 steps=$4; shift 4
  log "train $name"
  timeout 90 "$ZS" train --config "$config" --data "${TMPDIR:-/tmp}/zs-tokens.bin" --device gpu --steps "$steps" --batch-size "$batch" \
    --seq-len 1024 --warmup-steps 2 --sample-tokens 0 --gpu-mem-budget 60GiB --seed 1 --metrics "$out/$name.metrics" "$@" \
    >"$out/$name.log" 2>&1
  echo "train $name rc=$?" >>"$out/parts.txt"
}
train gpt2-fp32 gpt2 4 "$STEPS"
train gpt2-f16 gpt2 4 "$STEPS" --matmul-inputs f16
train llama-fp32 llama-3.2-1b 1 "$LLAMA_STEPS"
train llama-f16 llama-3.2-1b 1 "$LLAMA_STEPS" --matmul-inputs f16
# A summary: the selftest's failures and the losses side by side.
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "selftest.jsonl")) if l.startswith("{")] if os.path.exists(os.path.join(out, "selftest.jsonl")) else []
for r in rows:
    if r.get("kind") == "summary": print(f"selftest: {r['passed']} passed, {r['failed']} failed")
    elif not r.get("passed", True): print("FAILED", r.get("kernel"), r.get("worst"))
for model in ("gpt2", "llama"):
    runs = {}
    for p in ("fp32", "f16"):
        path = os.path.join(out, f"{model}-{p}.metrics")
        runs[p] = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    for a, b in zip(runs["fp32"], runs["f16"]):
        print(f"{model} step {a['step']}: loss fp32 {a['loss']:.5f} f16 {b['loss']:.5f} (diff {b['loss'] - a['loss']:+.5f}); "
              f"tokens/s fp32 {a['tokens_per_s']:.0f} f16 {b['tokens_per_s']:.0f}")
PY
