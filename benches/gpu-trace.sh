#!/usr/bin/env bash
# benches/gpu-trace.sh: timelines (`train --trace`) of the training runs whose steps are far from their
# kernels' time, in about two minutes on a lent GPU: GPT-2 124M with --matmul-inputs f16 and in fp32
# (B=4, T=1024, 5 steps, every block resident) and Llama-3.2-1B streamed at a 5 GiB budget (B=1, 3 steps).
# Each run leaves NAME.trace.json (open in https://ui.perfetto.dev), NAME.metrics and NAME.log in
# ./gpu-trace-out, packed into $OUT/gpu-trace.tar.gz (./gpu-trace.tar.gz without $OUT) for the device tool.
# First, `bench adam` (bench-adam.txt): the host's AdamW rate and memory bandwidth (STREAM triad), with the
# gradients and working copy GPT-2's runs use, since the update's sweep bounds their forward.
#
# Usage:  bash benches/gpu-trace.sh      (after the Vulkan loader is unpacked, as benches/gpu.sh says)
# Environment: ZS (default .device/zerostream).
set -uo pipefail
out=gpu-trace-out
rm -rf "$out" && mkdir -p "$out"
trap 'tar -czf "${OUT:-.}/gpu-trace.tar.gz" -C "$out" .' EXIT
trap 'exit 143' TERM INT
ZS=${ZS:-.device/zerostream}
[ -x "$ZS" ] || { echo "benches/gpu-trace.sh: no zerostream binary at $ZS (run benches/gpu-prepare.sh here first)" >&2; exit 1; }
tokens=${TMPDIR:-/tmp}/zs-trace-tokens.bin
python3 -c "import random, array, sys; random.seed(1337); array.array('H', (random.randrange(50257) for _ in range(1 << 20))).tofile(open(sys.argv[1], 'wb'))" "$tokens"
run() { # name limit flags...
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))" >&2
  timeout --signal=INT --kill-after=5 "$limit" "$ZS" train --data "$tokens" --device gpu --warmup-steps 1 --sample-tokens 0 \
    --trace "$out/$name.trace.json" --metrics "$out/$name.metrics" "$@" >"$out/$name.log" 2>&1
  echo "$name rc=$? $(date +%T)" | tee -a "$out/parts.txt" >&2
}
echo "== bench adam ($(date +%T))" >&2
for copy in f32 f16; do
  timeout 60 "$ZS" bench adam --params 134217728 --grad f32 --copy "$copy" >>"$out/bench-adam.txt" 2>&1
  echo "bench-adam-$copy rc=$? $(date +%T)" | tee -a "$out/parts.txt" >&2
done
# One group's worth, as the step updates them: a GPT-2 124M block (7.1M parameters) and a Llama-3.2-1B
# block (60.8M). On the H200 the step's per-group updates ran at 2.6-3.6 Gparam/s against 5.44 above
# (benches/results/2026-11-28-h200-analysis.md): this says whether the group's size is why.
for params in 7077888 60817408; do
  timeout 60 "$ZS" bench adam --params "$params" --grad f32 --copy f32 >>"$out/bench-adam.txt" 2>&1
  echo "bench-adam-$params rc=$? $(date +%T)" | tee -a "$out/parts.txt" >&2
done
f16=()
"$ZS" devices --json 2>/dev/null | grep -q '"matmul_f16_coop":true' && f16=(--matmul-inputs f16)
run gpt2-f16 40 --config gpt2 --steps 5 --batch-size 4 --seq-len 1024 --gpu-mem-budget 16GiB "${f16[@]}"
run gpt2-fp32 40 --config gpt2 --steps 5 --batch-size 4 --seq-len 1024 --gpu-mem-budget 16GiB
run llama-streamed 80 --config llama-3.2-1b --steps 3 --batch-size 1 --seq-len 1024 --gpu-mem-budget 5GiB
