#!/usr/bin/env bash
# benches/gpu.sh: what a lent GPU machine should measure, in one command, written into ONE markdown file
# and a JSON file of issue #22's goals beside it (results.json: each goal a named ratio, see
# benches/gpu_goals.py): first `zerostream selftest --device gpu` (every kernel and matmul variant
# against its plain-Rust twin on this adapter), the GPU test executables packed beside the binary
# (benches/gpu-prepare.sh; --copy-queue's order across two queues, the goldens) and `zerostream tune`
# (the matmul, attention and cooperative-matrix variants timed per shape class; the table it writes
# is what every later part runs with), then
# the adapter (zerostream devices, nvidia-smi), `zerostream bench kernels` (GPT-2 124M and 1.5B shapes, Llama-3.2-1B's products, and
# which matmul path the adapter took: tile configuration, subgroup or cooperative-matrix use),
# `bench h2d` / `bench d2h`, `bench overlap` (whether copies run under kernels on wgpu's one queue), a GPT-2 124M and a GPT-2 1.5B (gpt2-xl) training run on the GPU, and PyTorch
# on the same shapes: torch.matmul (fp32 without TF32, bf16 and f16; Llama's fp32 and bf16), scaled_dot_product_attention,
# pinned-memory copies, and a Hugging Face GPT2LMHeadModel fp32 training step. Each part is rendered into
# the results file as soon as it finishes, so a run cut short still leaves what it measured.
# Where the adapter has 16x16x16 (or 8x8x8) f16 cooperative matrices, tune also times the cooperative-matrix
# variants, bench kernels times the f16-input matmul (rows f16-coop) and the multiply-add alone (row
# matmul_coop_mma, their ceiling), the matmul table holds it against torch's bf16 and f16 matmul (issue
# #13's goal: at least 25% of torch bf16), and a third training run uses --matmul-inputs f16.
#
# Usage:  bash benches/gpu.sh [RESULTS.md]     (default: $OUT/results.md if $OUT is set, else ./gpu-results.md)
# Environment (all optional):
#   ZS       the zerostream binary (default: .device/zerostream if present, else target/release/zerostream)
#   TESTS    the packed GPU test executables (default: tests.tar.xz beside ZS; the part is left out without it)
#   B, T     micro-batch for kernels, training and PyTorch (default 4 and 1024)
#   STEPS    training steps per run (default 3; the first includes pipeline creation and is left out of the means)
#   XL_B, XL_T, XL_STEPS   the same for the 1.5B run (default B, T, STEPS)
#   SKIP     parts to leave out, space-separated: selftest tests tune kernels transfer torch train-gpt2 train-gpt2-xl
#            train-gpt2-f16 oversized unpinned copyq (the --copy-queue twins of gpt2 and the streamed run)
#   TUNE_SECONDS  the tuner's --max-seconds, whole seconds (default 150; the part may run 50 s longer)
#   KERNELS_LIMIT seconds `bench kernels` may run (default 240)
#   TUNE_FLAGS    flags for `tune` (default: its GPT-2 124M/1.5B and Llama-3.2-1B shape sets; --quick on lavapipe)
#   OVERSIZED_MODEL, OVERSIZED_BUDGET   the streamed-vs-resident pair (default llama-3.2-1b at 5GiB: its fp32 minimum at B=1 T=1024 is 4.0 GiB, so it
#            streams its blocks; the resident run gets 60GiB); OVERSIZED_B, OVERSIZED_T (default 1, T), OVERSIZED_ACCUM
#            (--grad-accum, default 4: one update per 4 micro-batches, as a run of an oversized model would)
#            The issue's own case, OVERSIZED_MODEL=llama-3.2-3b OVERSIZED_BUDGET=8GiB, holds about 64 GB of host
#            state per run and takes about 2.5x the 1B pair's time: for a run with minutes to spare.
#   BUDGET_GPT2, BUDGET_XL   --gpu-mem-budget of the two training runs (default 16GiB and 60GiB)
#   KERNEL_FLAGS  more flags for `bench kernels` (e.g. --quick on a software adapter)
#   ZEROSTREAM_GPU_WAIT_LIMIT_S  seconds a wait for the GPU may take before the process stops (default 60
#                 where nvidia-smi is found, else the binary's 600)
#   OVERLAP_FLAGS more flags for `bench overlap` (e.g. --m 256 --n 256 --k 256 on a software adapter)
# Raw outputs (JSON lines, logs) are kept beside the results file in one file, <name>.raw.txt.
#
# On a GPU machine without a Vulkan loader, unpack one first (../shared/device/README.md):
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
set -uo pipefail

results=${1:-${OUT:+$OUT/results.md}}
results=${results:-gpu-results.md}
goals_json="${results%.md}.json"
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${ZS:-}" ]; then
  if [ -x .device/zerostream ]; then ZS=.device/zerostream; else ZS=target/release/zerostream; fi
fi
B=${B:-4} T=${T:-1024} STEPS=${STEPS:-3} SKIP=${SKIP:-}
XL_B=${XL_B:-$B} XL_T=${XL_T:-$T} XL_STEPS=${XL_STEPS:-$STEPS}
BUDGET_GPT2=${BUDGET_GPT2:-16GiB} BUDGET_XL=${BUDGET_XL:-60GiB}
# Checked before anything runs (a bad value must not cost device time); base 10 even with leading zeros.
TUNE_SECONDS=${TUNE_SECONDS:-150}
case $TUNE_SECONDS in ''|*[!0-9]*) echo "benches/gpu.sh: TUNE_SECONDS must be a whole number of seconds, got '$TUNE_SECONDS'" >&2; exit 2;; esac
TUNE_SECONDS=$((10#$TUNE_SECONDS))
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
# On an NVIDIA machine a hung kernel costs a minute, not its part's whole limit, and says what it hung
# on (no wait of these runs comes near it there); elsewhere (lavapipe practice runs, whose steps can
# take a minute) the default of 600 s stands.
if command -v nvidia-smi >/dev/null; then export ZEROSTREAM_GPU_WAIT_LIMIT_S=${ZEROSTREAM_GPU_WAIT_LIMIT_S:-60}; fi
mkdir -p "$(dirname "$results")"
[ -x "$ZS" ] || { echo "no zerostream binary at $ZS (set ZS, or build: cargo build --release)" >&2; exit 1; }

skipped() { case " $SKIP " in *" $1 "*) echo "skipping $1" >&2; return 0;; esac; return 1; }
# Runs a part with a time limit, keeping its stdout and stderr; never stops the script.
# Every part ends before DEADLINE seconds from the start (default 560: a lent machine's command may run
# 10 minutes, and the render needs a few seconds): a part gets at most what is left, and a part with
# under 20 s left is not started (recorded as rc=deadline). Parts run in order of importance.
DEADLINE=${DEADLINE:-560}
part() { # name seconds command...
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS - 10))
  if [ "$left" -lt 20 ]; then
    echo "$name rc=deadline 0s: not started, ${DEADLINE}s deadline reached: $*" | tee -a "$work/parts.txt" >&2
    render
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (at most ${limit}s): $*" >&2
  local start=$SECONDS
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$work/$name.out" 2>"$work/$name.err"
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s: $*" | tee -a "$work/parts.txt" >&2
  render
  save_raw
}
# Keeps the raw outputs (JSON lines, logs) beside the results, in one file.
save_raw() { (cd "$work" && tail -n +1 parts.txt *.out *.err *.metrics) >"${results%.md}.raw.txt" 2>/dev/null; }

render() { python3 "$here/gpu_goals.py" "$work" "$goals_json" || echo "gpu_goals.py failed" >&2
python3 - "$work" "$results" "$B" "$T" "$XL_B" "$XL_T" "$goals_json" <<'PY'
import json, os, sys, datetime
work, results, B, T, XL_B, XL_T = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
goals_json = sys.argv[7]
def read(name):
    p = os.path.join(work, name)
    return open(p, errors="replace").read() if os.path.exists(p) else None
def jsonl(name):
    out = []
    for line in (read(name) or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try: out.append(json.loads(line))
            except ValueError: pass
    return out
def block(text, lang=""):
    return f"```{lang}\n{(text or '').rstrip()}\n```\n"
def tail(text, n=40):
    return "\n".join((text or "").rstrip().splitlines()[-n:])
def pct(x): return "-" if x is None else f"{100*x:.1f}%"
md = [f"# zerostream on a lent GPU ({datetime.date.today()})\n",
      f"Written by benches/gpu.sh; micro-batch B={B}, T={T}. Parts and their exit codes (124 = time limit):\n",
      block(read("parts.txt"))]
md += ["## Machine\n", block(read("machine.out"))]

# Issue #22's goals (the same figures as results.json).
if os.path.exists(goals_json):
    doc = json.load(open(goals_json))
    md += ["## Goals (issue #22)\n", "| goal | target | measured | met | detail / why not measured |", "|---|---:|---:|---|---|"]
    for g in doc["goals"]:
        measured = "-" if g["measured"] is None else f"{g['measured']:.4f}"
        md.append(f"| {g['name']} | {g['goal']} | {measured} | {g['met']} | {g.get('detail') or g.get('why')} |")
    md.append("")

# selftest: every kernel and variant against its twin, on this adapter.
checks = [r for r in jsonl("selftest.out") if r.get("kind") != "summary"]
summary = [r for r in jsonl("selftest.out") if r.get("kind") == "summary"]
if summary:
    s0 = summary[0]
    md += ["## zerostream selftest --device gpu\n",
           f"**{s0['passed']} passed, {s0['failed']} failed** in {s0.get('seconds', 0):.1f} s on {s0['adapter']}.\n"]
    bad = [r for r in checks if not r.get("passed", True)]
    if bad:
        md += ["Failed:\n", block("\n".join(json.dumps(r) for r in bad))]
    if s0.get("not_checked"):
        md += ["Not checked: " + "; ".join(f"{n['kernel']} ({n['why']})" for n in s0["not_checked"]) + "\n"]
elif read("selftest.err") is not None:
    md += ["## zerostream selftest (no summary)\n", block(tail(read("selftest.err")))]

# The carried GPU test executables (ZEROSTREAM_REQUIRE_GPU=1): each one's result, skips and failures.
if read("tests.out") is not None:
    rows, current = [], None
    for line in read("tests.out").splitlines():
        if line.startswith("### "): current = line[4:]; rows.append([current, "no result (cut short?)", []])
        elif line.startswith("test result:") and rows: rows[-1][1] = line[len("test result: "):]
        elif line.startswith("SKIPPED") and rows: rows[-1][2].append(line)
    md += ["## GPU tests (test executables built beside the binary)\n", "| tests | result | skipped |", "|---|---|---|"]
    md += [f"| {name} | {result} | {'; '.join(skips) or '-'} |" for name, result, skips in rows]
    md.append("")
    failed = [l for l in read("tests.out").splitlines() if l.startswith("---- ") or "panicked at" in l]
    if failed or not rows:
        md += [block(tail(read("tests.out"), 60))]

# tune: the variant chosen per shape class.
classes = [r for r in jsonl("tune.out") if r.get("kind") == "class"]
tsum = [r for r in jsonl("tune.out") if r.get("kind") == "summary"]
if classes:
    md += ["## zerostream tune\n", "| class | shape | best variant | ms | GFLOP/s | default ms | speedup | products |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in classes:
        md.append(f"| {r['class']} | {r['shape']} | {r['best']} | {r['best_seconds']*1e3:.3f} | {r['best_gflops']:.0f} | "
                  f"{r['default_seconds']*1e3:.3f} | {r['speedup']:.2f} | {', '.join(r['products'])} |")
    attention = [r for r in jsonl("tune.out") if r.get("kind") == "attention_class"]
    if attention:
        md += ["\n| attention class | shape | best variant | ms | default ms | speedup | calls |", "|---|---|---|---:|---:|---:|---|"]
        for r in attention:
            md.append(f"| {r['class']} | {r['shape']} | {r['best']} | {r['best_seconds']*1e3:.3f} | "
                      f"{r['default_seconds']*1e3:.3f} | {r['speedup']:.2f} | {', '.join(r['calls'])} |")
    for u in [r for r in jsonl("tune.out") if r.get("kind") == "upload"]:
        host = f"{u['host_gbps']:.1f} GB/s" if u.get("host_gbps") else f"unavailable ({u.get('host_unavailable')})"
        md.append(f"\nUpload staging ({u['bytes'] >> 20} MiB writes): mapped buffers {u['mapped_gbps']:.1f} GB/s, host memory {host}: **{u['chosen']}** kept.\n")
    for d in [r for r in jsonl("tune.out") if r.get("kind") == "download"]:
        pinned = f"{d['pinned_gbps']:.1f} GB/s" if d.get("pinned_gbps") else f"unavailable ({d.get('pinned_unavailable')})"
        md.append(f"Read-back ({d['bytes'] >> 20} MiB reads): mapped buffers {d['mapped_gbps']:.1f} GB/s, pinned host memory {pinned}: **{d['chosen']}** kept.\n")
    if tsum:
        md.append(f"\n{tsum[0]['classes']} matmul, {tsum[0].get('attention_classes', 0)} attention and {tsum[0].get('coop_classes', 0)} cooperative-matrix classes in {tsum[0]['seconds']:.0f} s; "
                  f"table {tsum[0]['table']}; mismatched variants: {tsum[0]['mismatched'] or 'none'}\n")
        for part, s in (tsum[0].get("spent") or {}).items():
            if s["setup_s"] + s["check_s"] + s["timing_s"] > 0: md.append(f"- {part}: {s['setup_s']:.1f} s making operands, {s['check_s']:.1f} s first runs and bit checks, {s['timing_s']:.1f} s timed runs")
        dropped = [l for l in (read("tune.err") or "").splitlines() if "are not timed on later classes" in l or "are timed on every class again" in l]
        md += [f"- {l}" for l in dropped] + [""]
elif read("tune.err") is not None:
    md += ["## zerostream tune (no classes)\n", block(tail(read("tune.err")))]
# The cooperative-matrix classes (adapters with cooperative matrices), whatever the fp32 classes did.
coop = [r for r in jsonl("tune.out") if r.get("kind") == "coop_class"]
if coop:
    md += ["## zerostream tune: cooperative-matrix classes\n", "| cooperative-matrix class | shape | best variant | ms | GFLOP/s | default ms | speedup | every variant (ms) |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in coop:
        every = ", ".join(f"{v['variant']} {v['seconds']*1e3:.3f}" for v in r["variants"])
        md.append(f"| {r['class']} | {r['shape']} | {r['best']} | {r['best_seconds']*1e3:.3f} | {r['best_gflops']:.0f} | "
                  f"{r['default_seconds']*1e3:.3f} | {r['speedup']:.2f} | {every} |")

kernels = [r for r in jsonl("kernels.out") if "kernel" in r]
steps = [r for r in jsonl("kernels.out") if "step_kernel_seconds" in r]
torch = jsonl("torch.out")
if kernels:
    k0 = kernels[0]
    md += ["## zerostream bench kernels\n",
           f"Adapter {k0['adapter']}; timer {k0['timer']}; peak: " +
           (f"{k0['peak_part']} datasheet, {k0['peak_fp32_gflops']/1e3:.1f} TFLOP/s fp32, {k0['peak_mem_gbps']:.0f} GB/s" if k0["peak_part"] else "unknown") +
           f"; measured device-to-device copy {k0['copy_gbps']:.0f} GB/s (read + written).\n",
           f"Matmul path the adapter took: {k0.get('matmul_path', 'not reported (an older binary)')}.\n",
           f"f16-input cooperative-matrix matmul: {k0.get('matmul_coop', 'not reported (an older binary)')}.\n",
           "| model | kernel | case | precision | shape | x/step | time (us) | rate | % of peak | % of copy | % of step |",
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in kernels:
        rate = f"{r['gflops']:.0f} GFLOP/s" if r["bound"] == "compute" else f"{r['gbps']:.0f} GB/s"
        case = r['case'] + (f" [{r['variant']}]" if r.get('variant') else "")
        md.append(f"| {r['model']} | {r['kernel']} | {case} | {r['precision']} | {r['shape']} | {r['per_step']} | "
                  f"{r['seconds']*1e6:.1f} | {rate} | {pct(r['fraction_of_peak'])} | {pct(r['fraction_of_copy'])} | {pct(r['share_of_step'])} |")
    md.append("")
    for s in steps:
        md.append(f"- {s['model']}: one fp32 training step's kernels take **{s['step_kernel_seconds']*1e3:.1f} ms** of device time "
                  f"({s['layers']} layers; {s['tokens_per_s_at_full_busy']:.0f} tokens/s if the device never waited).")
    md.append("")
elif read("kernels.err") is not None:
    md += ["## zerostream bench kernels (failed)\n", block(tail(read("kernels.err")))]

# zerostream matmul against torch.matmul on the same shapes.
tm = {(r["model"], r["case"], r["dtype"]): r for r in torch if r.get("kind") == "matmul"}
if kernels and tm:
    md += ["## Matmul: zerostream against torch.matmul, same shapes and layouts\n",
           "torch fp32 runs with TF32 off (true fp32 FMA, like ours); bf16 and f16 are all operands 16-bit on tensor cores. "
           "zerostream's bf16-B reads B as bf16 and computes in fp32; f16-coop rounds A and B to f16 and multiplies on "
           "cooperative matrices (f32 sums), reading the bf16 B where the bf16-B row does. "
           "Issue #13's goal: f16-coop at least 25% of torch bf16.\n",
           "| model | case | shape | zerostream fp32 GFLOP/s | torch fp32 GFLOP/s | ratio | zerostream bf16-B GFLOP/s | torch bf16 GFLOP/s | ratio "
           "| zerostream f16-coop GFLOP/s | torch f16 GFLOP/s | f16-coop / torch bf16 |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    zs = {(r["model"], r["case"], r["precision"]): r for r in kernels if r["kernel"] == "matmul"}
    coop_ratios = []
    for (model, case, prec), r in zs.items():
        if prec != "fp32": continue
        t32, t16, z16 = tm.get((model, case, "fp32")), tm.get((model, case, "bf16")), zs.get((model, case, "bf16-B"))
        th = tm.get((model, case, "f16"))
        zc = zs.get((model, case, "f16-coop bf16-B")) or zs.get((model, case, "f16-coop"))
        g = lambda x, k="gflops": x[k] if x else None
        f = lambda v: "-" if v is None else f"{v:.0f}"
        ratio = lambda a, b: "-" if a is None or b is None else f"{a/b:.2f}"
        if zc and t16: coop_ratios.append(g(zc) / g(t16))
        md.append(f"| {model} | {case} | {r['shape']} | {f(r['gflops'])} | {f(g(t32))} | {ratio(r['gflops'], g(t32))} | "
                  f"{f(g(z16))} | {f(g(t16))} | {ratio(g(z16), g(t16))} | {f(g(zc))} | {f(g(th))} | {ratio(g(zc), g(t16))} |")
    md.append("")
    if coop_ratios:
        coop_ratios.sort()
        md.append(f"f16-coop / torch bf16 over {len(coop_ratios)} products: min {coop_ratios[0]:.2f}, "
                  f"median {coop_ratios[len(coop_ratios)//2]:.2f}, max {coop_ratios[-1]:.2f} (goal: >= 0.25).\n")
    else:
        md.append("No f16-coop rows: the adapter has no 16x16x16 or 8x8x8 f16 cooperative matrices (see the line above).\n")

if torch:
    md += ["## PyTorch on the same machine\n", "| what | shape | dtype | time (us) | rate |", "|---|---|---|---:|---:|"]
    for r in torch:
        if r.get("kind") in ("matmul", "sdpa", "peak"):
            rate = f"{r['gflops']:.0f} GFLOP/s" if "gflops" in r else f"{r['gbps']:.0f} GB/s"
            md.append(f"| {r['kind']} {r.get('model','')} {r.get('case','')} | {r.get('shape','')} | {r.get('dtype','')} | {r['seconds']*1e6:.1f} | {rate} |")
        elif r.get("kind") == "copy":
            md.append(f"| {r['direction']} copy ({r['memory']}) | {r['bytes']>>20} MiB | uint8 | {r['seconds']*1e6:.1f} | {r['gbps']:.1f} GB/s |")
        elif r.get("kind") == "train":
            md.append(f"| GPT2LMHeadModel train step ({r['dtype']}, {r['attn']}) | B={r['batch']} T={r['seq_len']} | {r['dtype']} | {r['seconds']*1e6:.0f} | {r['tokens_per_s']:.0f} tokens/s |")
    md.append("")
    env = [r for r in torch if r.get("kind") == "env"]
    if env: md.append(f"PyTorch: {json.dumps(env[0])}\n")
if read("torch.err") and not torch:
    md += ["## PyTorch (failed)\n", block(tail(read("torch.err")))]

# Upload and download.
for link in ("h2d", "d2h"):
    rows = [json.loads(l) for l in (read(f"{link}.out") or "").splitlines() if l.startswith("{")]
    if rows:
        md += [f"## zerostream bench {link}\n", "| bytes | method | GB/s |", "|---:|---|---:|"]
        for r in rows[0]["runs"]:
            md.append(f"| {r['bytes']>>20} MiB | {r['method']} | {r['gbps']:.2f} |")
        md.append(f"\nhost memcpy (one thread): {rows[0]['memcpy_gbps']:.2f} GB/s\n")
        pinned = [r for r in torch if r.get("kind") == "copy" and r["direction"] == link and r["memory"] == "pinned"]
        # Prestaged (bytes staged before the clock) is the copy alone, the bound for the trainer's paths;
        # a d2h Pinned read is the trainer's only where the table of the adapter the benches open
        # (devices.json's preferred one, written after tune: this run's table or an earlier one's) chose
        # pinned read-backs; else the trainer reads through InPlace's mapped buffers.
        pinned_reads = any(r.get("read_back") == "pinned" for r in jsonl("devices.json") if r.get("preferred"))
        not_paths = {"Prestaged"} | ({"Pinned"} if link == "d2h" and not pinned_reads else set())
        paths = [r for r in rows[0]["runs"] if r["method"] not in not_paths]
        ours = {r["bytes"]: r["gbps"] for r in paths if r["gbps"] == max(x["gbps"] for x in paths if x["bytes"] == r["bytes"])}
        staged = {r["bytes"]: r["gbps"] for r in rows[0]["runs"] if r["method"] == "Prestaged"}
        if staged:
            md.append("Prestaged is the device's copy of bytes already in wgpu's staging memory (VRAM behind the BAR on a "
                      "discrete GPU, so it can exceed the link). Pinned is how the trainer uploads working copies kept in RAM: "
                      "the device's copy from the pinned host memory the AdamW thread writes them into (issue #22 item 4). "
                      "Best path / prestaged: "
                      + ", ".join(f"{b>>20} MiB {ours[b]/g:.2f}" for b, g in sorted(staged.items()) if b in ours and g > 0) + "\n")
        if pinned:
            md.append("| bytes | zerostream best GB/s | torch pinned GB/s | ratio |\n|---:|---:|---:|---:|")
            for p in pinned:
                if p["bytes"] in ours:
                    md.append(f"| {p['bytes']>>20} MiB | {ours[p['bytes']]:.2f} | {p['gbps']:.2f} | {ours[p['bytes']]/p['gbps']:.2f} |")
            md.append("")
        if link == "d2h" and any(r["method"] == "Pinned" for r in rows[0]["runs"]):
            md.append("d2h Pinned copies into pinned host memory mapped for good and waits for the submission (no map_async); "
                      "InPlace copies into a mapped buffer it reuses. The trainer reads through the one `zerostream tune` kept "
                      + ("(pinned), so both count as its paths above.\n" if pinned_reads else
                         "(mapped, or not tuned), so Pinned is left out of the best path above.\n"))
    elif read(f"{link}.err") is not None:
        md += [f"## zerostream bench {link} (failed)\n", block(tail(read(f"{link}.err")))]

# Copies under kernels: the answer issue #22 item 4's design waits on.
rows = jsonl("overlap.out")
if rows:
    md += ["## zerostream bench overlap\n",
           "Each copy alone, matmuls of about its length alone, then the matmuls submitted with the copy issued behind them; "
           "hidden = (copy + kernels - both) / min(copy, kernels): 1 overlapped, 0 serialised. "
           "Rows `queue2` and `transfer-queue` copy on a Vulkan queue beside wgpu's (a second of its family; a copy-only family), "
           "`stand-in-queue` on wgpu's own where the adapter has no other.\n",
           "| method | bytes | copy ms | matmuls | kernels ms | both ms | hidden |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| {r['method']} | {r['bytes']>>20} MiB | {r['copy_s']*1e3:.3f} | {r['matmuls']} | {r['kernels_s']*1e3:.3f} | {r['both_s']*1e3:.3f} | {r['hidden']:.2f} |")
    md.append("")
elif read("overlap.err") is not None:
    md += ["## zerostream bench overlap (failed)\n", block(tail(read("overlap.err")))]

# Training runs.
for run_name in ("gpt2", "gpt2-copyq", "gpt2-xl", "gpt2-f16", "oversized-streamed", "oversized-streamed-copyq", "oversized-resident",
                 "oversized-streamed-unpinned"):
    err = read(f"train-{run_name}.err")
    if err is None: continue
    m = jsonl(f"train-{run_name}.metrics")
    model = run_name.removesuffix("-f16").removesuffix("-copyq")
    flags = {"-f16": " --matmul-inputs f16", "-copyq": " --copy-queue", "-unpinned": " --no-pin-memory"}.get(run_name[run_name.rfind("-"):], "")
    if run_name.startswith("oversized"):
        # the streamed and resident runs of OVERSIZED_MODEL; the unpinned one uploads through staging
        model = run_name
    md += [f"## zerostream train --config {model} --device gpu{flags}\n"]
    if m:
        md += ["| step | loss | tokens/s | step (s) | compute (s) | upload (s) | download (s) | AdamW wait (s) | busy (host-timed) | busy (GPU timestamps) | peak device MiB |",
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in m:
            t_ = r["time"]
            md.append(f"| {r['step']} | {r['loss']:.4f} | {r['tokens_per_s']:.0f} | {t_['total_s']:.3f} | {t_['device_compute_s']:.3f} | {t_['upload_s']:.3f} | "
                      f"{t_['download_s']:.3f} | {t_['update_wait_s']:.3f} | {pct(r['device_busy_fraction'])} | {pct(r.get('gpu_busy_fraction'))} | {r['peak_device_bytes']/2**20:.0f} |")
        later = m[1:] or m
        mean_s = sum(r["time"]["total_s"] for r in later) / len(later)
        b_run, t_run = (B, T) if model == "gpt2" else (XL_B, XL_T)
        # Every kernel's work is linear in B at a fixed T, so another batch's estimate scales.
        est = [s for s in steps if s["model"] == model and s["seq_len"] == t_run and not flags]
        md.append("")
        if est:
            kernel_s = est[0]["step_kernel_seconds"] * b_run / est[0]["batch"]
            how = "" if est[0]["batch"] == b_run else f", scaled from B={est[0]['batch']} to B={b_run}"
            md.append(f"Device busy from GPU timestamps: the step's kernels take {kernel_s:.3f} s (bench kernels{how}) "
                      f"of a {mean_s:.3f} s step (mean after the first) = **{pct(kernel_s/mean_s)}**.\n")
    md += [block(tail("\n".join(l for l in err.splitlines() if not l.startswith("\r")), 14))]

md += ["## Raw output\n"]
for name in ("kernels.out", "torch.out"):
    if read(name): md += [f"`{name}`:\n", block(read(name), "jsonl")]
open(results, "w").write("\n".join(md) + "\n")
PY
}

# ---------------------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ); host: $(hostname); kernel: $(uname -r); cpus: $(nproc); $(free -g | awk '/Mem:/ {print "RAM " $2 " GiB"}')"
  echo "binary: $ZS ($("$ZS" --version 2>&1))"
  echo; echo "\$ zerostream devices"; "$ZS" devices 2>&1
  if command -v nvidia-smi >/dev/null; then
    echo; echo "\$ nvidia-smi --query-gpu=..."
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.max.sm,clocks.mem,power.limit,pstate,temperature.gpu,utilization.gpu --format=csv 2>&1
  fi
} >"$work/machine.out" 2>&1
render

# First: every kernel and variant against its twin (a failure here makes every number below suspect),
# then the tuner, whose table every later part runs with.
skipped selftest || part selftest 120 "$ZS" selftest --device gpu --json
# Then the GPU tests carried beside the binary (gpu-prepare.sh packs them): what only a real GPU can
# settle, such as --copy-queue's order across two queues. Each runs from the engine folder, as cargo would.
TESTS=${TESTS:-$(dirname "$ZS")/tests.tar.xz}
if ! skipped tests; then
  if [ -f "$TESTS" ]; then
    part tests 90 bash "$here/gpu-tests.sh" "$TESTS" "$work/tests"
  else
    echo "tests rc=absent 0s: no packed GPU tests at $TESTS (benches/gpu-prepare.sh makes them)" | tee -a "$work/parts.txt" >&2
  fi
fi
skipped tune || part tune $((TUNE_SECONDS + 50)) "$ZS" tune --json --max-seconds "$TUNE_SECONDS" ${TUNE_FLAGS:-}
skipped kernels || part kernels ${KERNELS_LIMIT:-240} "$ZS" bench kernels --batch-size "$B" --seq-len "$T" --json ${KERNEL_FLAGS:-}
# The read-back the trainer uses now (the table's, whether this run's tune or an earlier one chose it).
"$ZS" devices --json >"$work/devices.json" 2>/dev/null || true
skipped transfer || { part h2d 60 "$ZS" bench h2d --json; part d2h 90 "$ZS" bench d2h --json; part overlap 60 "$ZS" bench overlap --json ${OVERLAP_FLAGS:-}; }

# PyTorch: the same shapes, timed with CUDA events (median after warm-up).
cat >"$work/torch_ref.py" <<'PY'
import json, sys, time, statistics, torch
B, T = int(sys.argv[1]), int(sys.argv[2])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
def emit(**kv): print(json.dumps(kv), flush=True)
emit(kind="env", torch=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name(0),
     sms=torch.cuda.get_device_properties(0).multi_processor_count)
def bench(fn, target_s=0.2, max_reps=100):
    fn(); torch.cuda.synchronize()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < 3 or time.perf_counter() - start < target_s):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)
def rnd(*shape, dtype=torch.float32): return torch.randn(*shape, device=dev, dtype=dtype)
models = {"gpt2": (768, 12), "gpt2-xl": (1600, 25)}
V, bt = 50257, B * T
VC = min(8192, V)  # train's --vocab-chunk-rows default (model::vocab::DEFAULT_CHUNK_ROWS)
# Peaks measured here: a large product and a device copy.
for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")):
    a, b = rnd(8192, 8192, dtype=dtype), rnd(8192, 8192, dtype=dtype)
    s = bench(lambda: a @ b)
    emit(kind="peak", case="matmul 8192^3", shape="8192x8192x8192", dtype=name, seconds=s, gflops=2 * 8192**3 / s / 1e9)
x = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
s = bench(lambda: x.clone())
emit(kind="peak", case="device copy (read + write)", shape="1 GiB", dtype="uint8", seconds=s, gbps=2 * (1 << 30) / s / 1e9)
del x, a, b
# The model's products, in the layouts zerostream uses (HF Conv1D weights are (in, out)).
for model, (C, NH) in models.items():
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")):
        for lin, k, n in (("qkv", C, 3 * C), ("attn_proj", C, C), ("fc", C, 4 * C), ("fc_proj", 4 * C, C)):
            inp, w, dout = rnd(bt, k, dtype=dtype), rnd(k, n, dtype=dtype), rnd(bt, n, dtype=dtype)
            for case, fn, (m_, n_, k_) in ((f"{lin} forward", lambda: inp @ w, (bt, n, k)),
                                         (f"{lin} dinp", lambda: dout @ w.t(), (bt, k, n)),
                                         (f"{lin} dW", lambda: inp.t() @ dout, (k, n, bt))):
                s = bench(fn)
                emit(kind="matmul", model=model, case=case, shape=f"M={m_} N={n_} K={k_}", dtype=name, seconds=s, gflops=2 * m_ * n_ * k_ / s / 1e9)
            del inp, w, dout
        # The head one vocabulary chunk at a time, as zerostream trains it (bench kernels' lm_head rows).
        ln_f, wte, dlogits = rnd(bt, C, dtype=dtype), rnd(VC, C, dtype=dtype), rnd(bt, VC, dtype=dtype)
        for case, fn, (m_, n_, k_) in (("lm_head forward", lambda: ln_f @ wte.t(), (bt, VC, C)),
                                     ("lm_head dinp", lambda: dlogits @ wte, (bt, C, VC)),
                                     ("lm_head dW", lambda: dlogits.t() @ ln_f, (VC, C, bt))):
            s = bench(fn)
            emit(kind="matmul", model=model, case=case, shape=f"M={m_} N={n_} K={k_}", dtype=name, seconds=s, gflops=2 * m_ * n_ * k_ / s / 1e9)
        del ln_f, wte, dlogits
        if name == "f16": continue  # f16 only for the matmuls (the f16-coop comparison)
        # Causal attention; FLOPs count the causal half, backward 2.5x forward (as bench kernels does).
        hd = C // NH
        q, k_, v = (rnd(B, NH, T, hd, dtype=dtype).requires_grad_() for _ in range(3))
        flops = 4 * B * NH * hd * T * (T + 1) / 2
        sdpa = torch.nn.functional.scaled_dot_product_attention
        fwd = bench(lambda: sdpa(q, k_, v, is_causal=True))
        go = rnd(B, NH, T, hd, dtype=dtype)
        both = bench(lambda: sdpa(q, k_, v, is_causal=True).backward(go))
        shape = f"B={B} T={T} NH={NH} hd={hd}"
        emit(kind="sdpa", model=model, case="forward", shape=shape, dtype=name, seconds=fwd, gflops=flops / fwd / 1e9)
        emit(kind="sdpa", model=model, case="backward (fwd+bwd minus fwd)", shape=shape, dtype=name, seconds=both - fwd, gflops=2.5 * flops / (both - fwd) / 1e9)
        del q, k_, v, go
# Llama-3.2-1B's products (bench kernels times them for the fp32 and f16-coop goals), nn.Linear's
# layout: weights (out, in), y = x W^T, dx = dy W, dW = dy^T x; the head by vocabulary chunks.
LC, LKV, LF, LV = 2048, 8 * 64, 8192, 128256
for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
    for lin, k, n in (("q_proj", LC, LC), ("k_proj", LC, LKV), ("v_proj", LC, LKV), ("o_proj", LC, LC),
                      ("gate_proj", LC, LF), ("up_proj", LC, LF), ("down_proj", LF, LC), ("lm_head", LC, min(8192, LV))):
        inp, w, dout = rnd(bt, k, dtype=dtype), rnd(n, k, dtype=dtype), rnd(bt, n, dtype=dtype)
        for case, fn, (m_, n_, k_) in ((f"{lin} forward", lambda: inp @ w.t(), (bt, n, k)),
                                     (f"{lin} dinp", lambda: dout @ w, (bt, k, n)),
                                     (f"{lin} dW", lambda: dout.t() @ inp, (n, k, bt))):
            s = bench(fn)
            emit(kind="matmul", model="llama-3.2-1b", case=case, shape=f"M={m_} N={n_} K={k_}", dtype=name, seconds=s, gflops=2 * m_ * n_ * k_ / s / 1e9)
        del inp, w, dout
torch.cuda.empty_cache()
# Host<->device copies, pinned and pageable, the sizes of bench h2d/d2h.
for size in (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20):
    gpu = torch.empty(size, dtype=torch.uint8, device=dev)
    for memory in ("pinned", "pageable"):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=(memory == "pinned")).random_(0, 255)
        s = bench(lambda: gpu.copy_(host, non_blocking=True))
        emit(kind="copy", direction="h2d", memory=memory, bytes=size, seconds=s, gbps=size / s / 1e9)
        s = bench(lambda: host.copy_(gpu, non_blocking=True))
        emit(kind="copy", direction="d2h", memory=memory, bytes=size, seconds=s, gbps=size / s / 1e9)
# A GPT-2 124M training step in fp32 (TF32 off), as Hugging Face's model computes it.
from transformers import GPT2Config, GPT2LMHeadModel
model = GPT2LMHeadModel(GPT2Config()).to(dev)
attn = getattr(model.config, "_attn_implementation", "?")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
ids = torch.randint(0, V, (B, T + 1), device=dev)
def step(dtype):
    # HF shifts the labels itself; fine for timing. bf16-autocast is the reference for --matmul-inputs f16.
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(dtype == "bf16-autocast")):
        loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for dtype in ("fp32", "bf16-autocast"):
    for _ in range(2): step(dtype)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter(); step(dtype); torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    emit(kind="train", model="gpt2", dtype=dtype, attn=attn, batch=B, seq_len=T, seconds=s, tokens_per_s=B * T / s)
PY
skipped torch || part torch 200 python3 "$work/torch_ref.py" "$B" "$T"

# Training: random uint16 tokens (raw nanoGPT-style file), a few steps of each model on the GPU.
python3 - "$work/tokens.bin" <<'PY'
import random, sys, array
random.seed(1337)
array.array("H", (random.randrange(50257) for _ in range(1 << 20))).tofile(open(sys.argv[1], "wb"))
PY
train() { # name model budget seconds batch seq_len steps [more flags]
  local name=$1 model=$2 budget=$3 limit=$4 batch=$5 seq=$6 steps=$7; shift 7
  part "train-$name" "$limit" "$ZS" train --config "$model" --data "$work/tokens.bin" --device gpu --steps "$steps" \
    --batch-size "$batch" --seq-len "$seq" --warmup-steps 1 --sample-tokens 0 --gpu-mem-budget "$budget" \
    --metrics "$work/train-$name.metrics" "$@"
}
skipped train-gpt2 || train gpt2 gpt2 "$BUDGET_GPT2" 120 "$B" "$T" "$STEPS"
# The same with the big copies on a second queue beside the kernels (the goals count the faster).
skipped train-gpt2 || skipped copyq || train gpt2-copyq gpt2 "$BUDGET_GPT2" 120 "$B" "$T" "$STEPS" --copy-queue
if "$ZS" devices --json 2>/dev/null | grep -q '"matmul_f16_coop":true'; then
  skipped train-gpt2-f16 || train gpt2-f16 gpt2 "$BUDGET_GPT2" 120 "$B" "$T" "$STEPS" --matmul-inputs f16
fi
# The oversized pair: the same model streamed under a small budget and with every block resident.
OVERSIZED_MODEL=${OVERSIZED_MODEL:-llama-3.2-1b} OVERSIZED_BUDGET=${OVERSIZED_BUDGET:-5GiB}
OVERSIZED_B=${OVERSIZED_B:-1} OVERSIZED_T=${OVERSIZED_T:-$T} OVERSIZED_ACCUM=${OVERSIZED_ACCUM:-4}
# Micro-batches per step: at 1 the update over all parameters paces each step's forward (the
# 2026-11-28 trace: 0.30 s of 0.90 s waiting for it), which no overlap of copies can hide.
oversized_flags=(--grad-accum "$OVERSIZED_ACCUM")
if ! skipped oversized; then
  train oversized-streamed "$OVERSIZED_MODEL" "$OVERSIZED_BUDGET" 150 "$OVERSIZED_B" "$OVERSIZED_T" "$STEPS" "${oversized_flags[@]}"
  train oversized-resident "$OVERSIZED_MODEL" 60GiB 150 "$OVERSIZED_B" "$OVERSIZED_T" "$STEPS" "${oversized_flags[@]}"
  skipped copyq || train oversized-streamed-copyq "$OVERSIZED_MODEL" "$OVERSIZED_BUDGET" 150 "$OVERSIZED_B" "$OVERSIZED_T" "$STEPS" "${oversized_flags[@]}" --copy-queue
fi
# The streamed run again with the working copies in pageable memory (uploads through the staging ring):
# what pinned working copies (the default) gained.
skipped oversized || skipped unpinned || train oversized-streamed-unpinned "$OVERSIZED_MODEL" "$OVERSIZED_BUDGET" 150 "$OVERSIZED_B" "$OVERSIZED_T" "$STEPS" "${oversized_flags[@]}" --no-pin-memory
# Last: the 1.5B run, the least needed by the goals.
skipped train-gpt2-xl || train gpt2-xl gpt2-xl "$BUDGET_XL" 240 "$XL_B" "$XL_T" "$XL_STEPS"
render
echo "results: $results and $goals_json" >&2
cat "$work/parts.txt" >&2
