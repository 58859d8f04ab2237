#!/usr/bin/env bash
# benches/cpu_vs_torch.sh: zerostream's `cpu` device against PyTorch on the same machine: GPT-2 124M fp32
# training at B=4 T=256, seconds per step of each side and their ratio (issue #13, item 1).
#
# zerostream trains `--config gpt2` on a GPT-2 token file made from examples/data/hamlet.txt (the median
# of its steps after the first, which warms caches and allocations); PyTorch runs
# ../shared/reference/torch_gpt2_step_cpu.py (Hugging Face GPT2LMHeadModel, random init, fused AdamW; the
# median of three steps after a warm-up step) with the Python of a virtual environment. The sides run
# alternately ROUNDS times, so that a change in the machine's load hits both; the best and the median
# round of each side are compared. Then (unless CPU_TIME=0) the CPU seconds each side spends on a step:
# user + system time of a run with two more steps minus that of a shorter run, halved (PyTorch's script
# with its timed loop at 1 and 3 steps). A busy machine changes zerostream's figure little; PyTorch's
# OpenMP threads spin while they wait, so on a loaded machine its figure grows (read it at low load).
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

if [ "${CPU_TIME:-1}" != 0 ]; then
  echo "== CPU seconds per step (user + system; load $(load))"
  # user + system seconds of a command and its children.
  cpu_s() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN); print(f"{r.ru_utime + r.ru_stime:.2f}")' "$@"; }
  zs_cpu() { cpu_s "$ZS" train --device cpu --config gpt2 --data "$work/hamlet.bin" --batch-size 4 --seq-len 256 \
    --steps "$1" --sample-tokens 0; }
  for n in 1 3; do
    sed "s/^for _ in range(3):/for _ in range($n):/; s/^t = sorted(ts)\[1\]/t = sorted(ts)[len(ts) \/\/ 2]/" \
      "$torch_script" > "$work/torch_$n.py"
    grep -q "^for _ in range($n):" "$work/torch_$n.py" \
      || { echo "cannot resize the timed loop of $torch_script (its form changed)" >&2; exit 1; }
  done
  zs_a=$(zs_cpu 2); zs_b=$(zs_cpu 4)
  torch_a=$(cpu_s "$venv/bin/python" "$work/torch_1.py"); torch_b=$(cpu_s "$venv/bin/python" "$work/torch_3.py")
  python3 - "$zs_a" "$zs_b" "$torch_a" "$torch_b" <<'PY'
import sys
zs_a, zs_b, torch_a, torch_b = map(float, sys.argv[1:5])
zs, torch = (zs_b - zs_a) / 2, (torch_b - torch_a) / 2
print(f"zerostream {zs:.2f} CPU-s/step ({zs_a:.2f} s for 2 steps, {zs_b:.2f} s for 4)")
print(f"PyTorch    {torch:.2f} CPU-s/step ({torch_a:.2f} s for 2 steps, {torch_b:.2f} s for 4)")
print(f"CPU-time ratio (PyTorch / zerostream): {torch / zs:.2f}x")
PY
fi

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
