#!/usr/bin/env bash
# benches/cpu_vs_torch.sh: zerostream's `cpu` device against PyTorch on the same machine, in one run:
# GPT-2 124M fp32 training at B=4 T=256, tokens/s of each side and their ratio (issue #13, item 1).
#
# zerostream trains `--config gpt2` on a GPT-2 token file made from examples/data/hamlet.txt and reports the
# tokens/s of the steps after the first (the first one warms caches and allocations); PyTorch runs
# ../shared/reference/torch_gpt2_step_cpu.py (Hugging Face GPT2LMHeadModel, random init, fused AdamW; the
# median of three steps after a warm-up step) with the Python of a virtual environment.
#
# Usage:  bash benches/cpu_vs_torch.sh [TORCH_VENV]
# Environment (all optional):
#   TORCH_VENV  the venv whose bin/python has torch and transformers (default /work/venv-torch); the first
#               argument wins over it
#   ZS          a zerostream binary to use instead of building one (e.g. one built from another commit)
#   STEPS       zerostream training steps (default 4; the first is left out)
#   CARGO_TARGET_DIR  where cargo builds (default ./target)
# The load of the machine (uptime) is printed before and after each side: other builds running at the same
# time slow both sides, and the ratio is only meaningful when the load stayed the same.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-${TORCH_VENV:-/work/venv-torch}}
steps=${STEPS:-4}
torch_script=../shared/reference/torch_gpt2_step_cpu.py
[ -x "$venv/bin/python" ] || { echo "no Python at $venv/bin/python (give a venv with torch and transformers)" >&2; exit 1; }
[ -f "$torch_script" ] || { echo "no PyTorch reference at $torch_script" >&2; exit 1; }

if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket)' || true
echo "AVX-512 flags: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "zerostream: $ZS ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"

echo "== zerostream cpu (load: $(uptime | sed 's/.*load average: //'))"
"$ZS" prepare --text examples/data/hamlet.txt --out "$work/hamlet.bin" > /dev/null
"$ZS" train --device cpu --config gpt2 --data "$work/hamlet.bin" --batch-size 4 --seq-len 256 \
  --steps "$steps" --sample-tokens 0 --metrics "$work/m.jsonl" > "$work/zs.log" 2>&1 \
  || { cat "$work/zs.log" >&2; exit 1; }
zs_tps=$(python3 - "$work/m.jsonl" <<'EOF'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "tokens_per_s" in r and "step" in r]
later = steps[1:] or steps
# tokens/s over the later steps together: total tokens over total seconds.
secs = sum(r["time"]["total_s"] for r in later)
toks = sum(r["tokens_per_s"] * r["time"]["total_s"] for r in later)
for r in steps:
    print(f"  step {r['step']}: loss {r['loss']:.4f}, {r['time']['total_s']:.2f} s, {r['tokens_per_s']:.1f} tokens/s, "
          f"compute {r['time']['gpu_compute_s']:.2f} s, AdamW wait {r['time']['update_wait_s']:.2f} s", file=sys.stderr)
print(f"{toks / secs:.1f}")
EOF
)
echo "zerostream cpu GPT-2 124M fp32 B=4 T=256: $zs_tps tokens/s (steps 2..$steps)"

echo "== PyTorch (load: $(uptime | sed 's/.*load average: //'))"
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())'
torch_out=$("$venv/bin/python" "$torch_script")
echo "$torch_out"
torch_tps=$(echo "$torch_out" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')

echo "== result (load: $(uptime | sed 's/.*load average: //'))"
python3 -c "print(f'zerostream {float($zs_tps):.1f} tokens/s, PyTorch {float($torch_tps):.1f} tokens/s, ratio {float($zs_tps)/float($torch_tps):.2f}x')"
