#!/usr/bin/env bash
# benches/slow_network.sh: --grad-compression between two MPI processes as if they were two machines
# (issue #24, item 3). OpenMPI is told to use TCP over the loopback interface (no shared memory), and
# the loopback is limited with a token-bucket filter (`tc qdisc ... tbf`) to each RATE in turn, so the
# exchange costs what it would over such a link. Both ranks' traffic shares the one limited interface.
#
# Two parts:
# 1. Time: GPT-2 124M (`--config gpt2`, random weights, bf16 working copy, B=1, T=32, stage 2 unless
#    the mode names another), where the exchange dominates the step: per RATE and MODE, the gradient and parameter bytes a rank sends
#    per step (comm_grad_bytes, comm_param_bytes) and the mean step time over the steps after the
#    first, against `none`.
# 2. Loss: the small GPT-2 and Llama of benches/adam_state/ (byte-level Hamlet) trained LOSS_STEPS
#    steps on two ranks at full loopback speed (the loss does not depend on the link): the loss at
#    the last step against `none`'s, with the curves drawn by `zerostream plot`.
#
# Usage:  sudo bash benches/slow_network.sh        (tc needs CAP_NET_ADMIN; mpirun runs as root here)
# Environment: ZS (a zerostream built with --features zerostream/mpi; default: build it), RATES
# (default "1gbit 10gbit"), MODES (default "none bf16 int8 onebit topk:0.01 onebit/int8
# topk:0.01/int8 none@0 onebit@0": a --grad-compression mode, optionally with a --param-compression
# mode after a slash, and a --zero-stage after an @, default 2: stage 0 all-reduces the gradients and
# gathers no working copy), TIME_STEPS (default 6; 0 skips the time part), LOSS_STEPS (default
# 300; 0 skips the loss part), OUT (keeps metrics, logs and SVGs; default: a new temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${RATES:-"1gbit 10gbit"}
modes=${MODES:-"none bf16 int8 onebit topk:0.01 onebit/int8 topk:0.01/int8 none@0 onebit@0"}
time_steps=${TIME_STEPS:-6}
loss_steps=${LOSS_STEPS:-300}
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream --features zerostream/mpi
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=${OUT:-$(mktemp -d)}
mkdir -p "$work"
mpi=(mpirun --allow-run-as-root --oversubscribe -n 2 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
limit_off() { tc qdisc del dev lo root 2>/dev/null || true; }
trap limit_off EXIT
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $("$ZS" --version); $(mpirun --version | head -1)"
"$ZS" prepare --quiet --text examples/data/hamlet.txt --out "$work/hamlet.bin" --tokenizer bytes --val-fraction 0.1

# The flags of a MODES entry: GRAD, GRAD/PARAM, either with @STAGE after it.
flags_of() {
  local mode=${1%@*} stage=2
  case "$1" in *@*) stage=${1##*@} ;; esac
  case "$mode" in
    */*) echo "--zero-stage $stage --grad-compression ${mode%%/*} --param-compression ${mode#*/}" ;;
    *) echo "--zero-stage $stage --grad-compression $mode" ;;
  esac
}

# Mean of a metrics field over the steps after the first (start-up), and its value at the last step.
summary() {
  python3 - "$@" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steady = rows[1:] or rows
mean = lambda f: sum(f(r) for r in steady) / len(steady)
print(f"{mean(lambda r: r['time']['total_s']):.3f} {mean(lambda r: r['comm_grad_bytes']):.0f} "
      f"{mean(lambda r: r['comm_param_bytes']):.0f} {rows[-1]['loss']:.4f}")
PY
}

[ "$time_steps" -gt 0 ] || rates=""
echo
echo "== time: GPT-2 124M, 2 ranks over TCP on lo, bf16 working copy, B=1, T=32, stage 2 unless @, $time_steps steps"
echo "| link | mode (grad[/param][@stage]) | s/step | vs none | gradient MB sent/step | vs none | parameter MB sent/step |"
echo "|---|---|---|---|---|---|---|"
for rate in $rates; do
  limit_off
  tc qdisc add dev lo root tbf rate "$rate" burst 1mbit latency 400ms
  base_s="" base_g=""
  for mode in $modes; do
    name="time-$rate-$(echo "$mode" | tr ':/@' '_+-')"
    "${mpi[@]}" "$ZS" train --device cpu --config gpt2 --data "$work/hamlet.bin" --batch-size 1 --seq-len 32 \
      --precision bf16 --steps "$time_steps" $(flags_of "$mode") --sample-tokens 0 \
      --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1 || { echo "| $rate | $mode | failed: see $work/$name.log |"; continue; }
    read -r s g p _ <<< "$(summary "$work/$name.jsonl")"
    [ -z "$base_s" ] && base_s=$s base_g=$g
    python3 -c "import sys; s,g,p,bs,bg=map(float,sys.argv[1:]); print(f'| $rate | $mode | {s:.2f} | {bs/s:.2f}x faster | {g/1e6:.1f} | {bg/max(g,1):.1f}x fewer | {p/1e6:.1f} |')" \
      "$s" "$g" "$p" "$base_s" "$base_g"
  done
done
limit_off

[ "$loss_steps" -gt 0 ] || { echo "kept: $work"; exit 0; }
echo
echo "== loss: benches/adam_state's small GPT-2 and Llama, byte-level Hamlet, 2 ranks (MPI over TCP, unlimited), $loss_steps steps"
echo "| model | mode | loss at the last step | vs none |"
echo "|---|---|---|---|"
for model in gpt2 llama; do
  base=""
  files=()
  for mode in $modes; do
    name="loss-$model-$(echo "$mode" | tr ':/@' '_+-')"
    "${mpi[@]}" "$ZS" train --device cpu --config "benches/adam_state/$model-small-bytes.json" \
      --data "$work/hamlet.bin" --batch-size 8 --seq-len 128 --steps "$loss_steps" --lr 3e-3 --warmup-steps 30 \
      --lr-schedule cosine $(flags_of "$mode") --sample-tokens 0 \
      --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1 || { echo "| $model | $mode | failed: see $work/$name.log |"; continue; }
    read -r _ _ _ loss <<< "$(summary "$work/$name.jsonl")"
    [ -z "$base" ] && base=$loss
    python3 -c "import sys; l,b=map(float,sys.argv[1:]); print(f'| $model | $mode | {l:.4f} | {100*(l-b)/b:+.2f}% |')" "$loss" "$base"
    files+=("$work/$name.jsonl")
  done
  "$ZS" plot --quiet -o "$work/$model-grad-compression.svg" "${files[@]}"
done
echo "kept: $work"
