#!/usr/bin/env bash
# benches/cpu_vs_torch.sh: zerostream's `cpu` device against PyTorch on the same machine: GPT-2 124M fp32
# training at B=4 T=256, seconds per step of each side and their ratio (issue #13, item 1).
#
# zerostream trains `--config gpt2` on a GPT-2 token file made from examples/data/hamlet.txt (the median
# of its steps after the first, which warms caches and allocations); PyTorch runs
# ../shared/reference/torch_gpt2_step_cpu.py (Hugging Face GPT2LMHeadModel, random init, fused AdamW; the
# median of three steps after a warm-up step) with the Python of a virtual environment. The sides run
# alternately ROUNDS times, so that a change in the machine's load hits both; the best and the median
# round of each side are compared.
#
# Usage:  bash benches/cpu_vs_torch.sh [TORCH_VENV]
# Environment (all optional):
#   TORCH_VENV  the venv whose bin/python has torch and transformers (default /work/venv-torch); the first
#               argument wins over it
#   ZS          a zerostream binary to use instead of building one (e.g. one built from another commit)
#   ZS_BEFORE   a second zerostream binary (an older commit) run in each round too, as a third side
#   ROUNDS      how many times each side runs (default 3)
#   STEPS       zerostream training steps per run (default 4; the first is left out)
#   CARGO_TARGET_DIR  where cargo builds (default ./target)
# The load average (uptime) is printed before each run: other processes slow every side.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-${TORCH_VENV:-/work/venv-torch}}
steps=${STEPS:-4}
rounds=${ROUNDS:-3}
torch_script=../shared/reference/torch_gpt2_step_cpu.py
[ -x "$venv/bin/python" ] || { echo "no Python at $venv/bin/python (give a venv with torch and transformers)" >&2; exit 1; }
[ -f "$torch_script" ] || { echo "no PyTorch reference at $torch_script" >&2; exit 1; }
[ "$steps" -ge 2 ] || { echo "STEPS must be at least 2 (the first step is left out)" >&2; exit 1; }

if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
load() { uptime | sed 's/.*load average: //'; }

echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket)' || true
echo "AVX-512 flags: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "zerostream: $ZS ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))${ZS_BEFORE:+, before: $ZS_BEFORE}"
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'
"$ZS" prepare --text examples/data/hamlet.txt --out "$work/hamlet.bin" > /dev/null

# One zerostream run: prints its steps to stderr and the median seconds per step (steps 2..) to stdout.
zs_run() {
  "$1" train --device cpu --config gpt2 --data "$work/hamlet.bin" --batch-size 4 --seq-len 256 \
    --steps "$steps" --sample-tokens 0 --metrics "$work/m.jsonl" > "$work/zs.log" 2>&1 \
    || { cat "$work/zs.log" >&2; exit 1; }
  python3 - "$work/m.jsonl" <<'PY'
import json, statistics, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r and "step" in r]
for r in steps:
    print(f"    step {r['step']}: loss {r['loss']:.4f}, {r['time']['total_s']:.2f} s "
          f"(compute {r['time']['device_compute_s']:.2f} s, AdamW wait {r['time']['update_wait_s']:.2f} s)", file=sys.stderr)
print(f"{statistics.median(r['time']['total_s'] for r in steps[1:]):.3f}")
PY
  rm -f "$work/m.jsonl"
}

declare -a zs_s before_s torch_s
for round in $(seq "$rounds"); do
  echo "== round $round/$rounds"
  echo "  zerostream (load $(load))"
  zs_s+=("$(zs_run "$ZS")")
  echo "  -> ${zs_s[-1]} s/step"
  if [ -n "${ZS_BEFORE:-}" ]; then
    echo "  zerostream before (load $(load))"
    before_s+=("$(zs_run "$ZS_BEFORE")")
    echo "  -> ${before_s[-1]} s/step"
  fi
  echo "  PyTorch (load $(load))"
  out=$("$venv/bin/python" "$torch_script")
  echo "    $out"
  torch_s+=("$(echo "$out" | sed -n 's/.*: \([0-9.]*\) s\/step.*/\1/p')")
  echo "  -> ${torch_s[-1]} s/step"
done

echo "== result (load $(load)): seconds per step, best / median of $rounds rounds; tokens/s = 1024 / s"
python3 - "${zs_s[*]}" "${before_s[*]:-}" "${torch_s[*]}" <<'PY'
import statistics, sys
zs, before, torch = ([float(x) for x in a.split()] for a in sys.argv[1:4])
def line(name, xs):
    print(f"{name:18} best {min(xs):6.2f} s ({1024 / min(xs):6.1f} tokens/s), median {statistics.median(xs):6.2f} s, all {xs}")
line("zerostream", zs)
if before:
    line("zerostream before", before)
line("PyTorch", torch)
print(f"ratio (PyTorch s / zerostream s): best {min(torch) / min(zs):.2f}x, median {statistics.median(torch) / statistics.median(zs):.2f}x")
if before:
    print(f"before ratio: best {min(torch) / min(before):.2f}x, median {statistics.median(torch) / statistics.median(before):.2f}x")
PY
