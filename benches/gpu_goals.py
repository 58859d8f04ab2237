#!/usr/bin/env python3
"""Issue #22's goals as named ratios, from the raw outputs benches/gpu.sh collected in its work folder.

Usage: gpu_goals.py WORK_DIR RESULTS.json

Writes {"adapter", "date", "binary", "selftest", "tune", "goals": [{name, goal, measured, met, detail | why}]}.
A goal that could not be measured has "measured": null, "met": null and a "why". The names are stable
(scripts read them):

  fp32_matmul_fraction_of_peak      min over the fp32 matmul rows of bench kernels: GFLOP/s / fp32 peak (goal 0.40)
  coop_f16_vs_torch_bf16            median over products: f16-coop GFLOP/s / torch bf16 matmul GFLOP/s (goal 0.25)
  attention_vs_torch_sdpa_fp32      torch fp32 SDPA (fwd+bwd) time / ours (fwd+bwd), worst model (goal 0.25)
  upload_vs_torch_pinned            our best h2d GB/s / torch pinned h2d at the largest size both measured (goal 0.80)
  download_vs_torch_pinned          the same for d2h (goal 0.80)
  gpt2_124m_fp32_tokens_vs_torch    our gpt2 train tokens/s (mean after step 0) / torch GPT2LMHeadModel fp32 (goal 0.5)
  gpt2_124m_f16_vs_torch_bf16       our --matmul-inputs f16 run / torch bf16-autocast step (goal 0.3)
  oversized_streamed_vs_resident    streamed run's tokens/s / the same model resident (goal 0.7)
  oversized_gpu_busy                the streamed run's gpu_busy_fraction (GPU timestamps), mean after step 0 (goal 0.9)
"""
import datetime
import json
import os
import statistics
import sys


def read(work, name):
    p = os.path.join(work, name)
    return open(p, errors="replace").read() if os.path.exists(p) else None


def jsonl(work, name):
    out = []
    for line in (read(work, name) or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def goal(name, target, measured, detail=None, why=None):
    if measured is None:
        return {"name": name, "goal": target, "measured": None, "met": None, "why": why or "not measured"}
    return {"name": name, "goal": target, "measured": round(measured, 4), "met": measured >= target, "detail": detail}


def part_note(work, part):
    """Why a part left nothing: its exit code line from parts.txt, or that it never ran."""
    for line in (read(work, "parts.txt") or "").splitlines():
        if line.startswith(part + " "):
            return f"part {line}"
    return f"part {part} did not run (SKIP, or the script stopped before it)"


def train_tokens(work, name):
    rows = jsonl(work, f"train-{name}.metrics")
    later = rows[1:] or rows
    return statistics.mean(r["tokens_per_s"] for r in later) if later else None, later


def best_train(work, name):
    """The faster of the run `name` and its `--copy-queue` twin (`name-copyq`): tokens/s, rows, flags."""
    runs = [(train_tokens(work, n), flags) for n, flags in ((name, ""), (f"{name}-copyq", " with --copy-queue"))]
    runs = [(t, rows, flags) for (t, rows), flags in runs if t]
    return max(runs, key=lambda r: r[0]) if runs else (None, [], "")


def goals(work):
    kernels = [r for r in jsonl(work, "kernels.out") if "kernel" in r]
    torch = jsonl(work, "torch.out")
    out = []

    fp32 = [r for r in kernels if r["kernel"] == "matmul" and r["precision"] == "fp32" and r.get("fraction_of_peak") is not None]
    if fp32:
        worst = min(fp32, key=lambda r: r["fraction_of_peak"])
        out.append(goal("fp32_matmul_fraction_of_peak", 0.40, worst["fraction_of_peak"],
                        f"min over {len(fp32)} products ({worst['model']} {worst['case']} {worst['shape']}, variant {worst.get('variant')}); "
                        f"median {statistics.median(r['fraction_of_peak'] for r in fp32):.4f}; worst per model: "
                        + ", ".join(f"{m} {min(r['fraction_of_peak'] for r in fp32 if r['model'] == m):.4f}"
                                    for m in sorted({r['model'] for r in fp32}))))
    else:
        why = "no datasheet peak for this adapter" if kernels else part_note(work, "kernels")
        out.append(goal("fp32_matmul_fraction_of_peak", 0.40, None, why=why))

    tm = {(r["model"], r["case"], r["dtype"]): r for r in torch if r.get("kind") == "matmul"}
    coop = [r for r in kernels if r["kernel"] == "matmul" and r["precision"].startswith("f16-coop")]
    ratios = [r["gflops"] / tm[(r["model"], r["case"], "bf16")]["gflops"] for r in coop if (r["model"], r["case"], "bf16") in tm]
    # The cooperative multiply-add's own rate (coop_probe.wgsl: no loads in its loop), every variant's ceiling.
    probe = [r for r in kernels if r["kernel"] == "matmul_coop_mma"]
    ceiling = f"; the multiply-adds alone (coop_probe) {probe[0]['gflops']:.0f} GFLOP/s" if probe else ""
    if ratios:
        out.append(goal("coop_f16_vs_torch_bf16", 0.25, statistics.median(ratios),
                        f"median over {len(ratios)} products; min {min(ratios):.4f}, max {max(ratios):.4f}{ceiling}"))
    else:
        why = "no f16-coop rows: " + (kernels[0].get("matmul_coop", "?") if kernels else part_note(work, "kernels"))
        out.append(goal("coop_f16_vs_torch_bf16", 0.25, None, why=why if coop == [] else "no torch bf16 matmuls: " + part_note(work, "torch")))

    att = {}
    for r in kernels:
        if r["kernel"] in ("attention_forward", "attention_backward"):
            att.setdefault(r["model"], 0.0)
            att[r["model"]] += r["seconds"]
    sdpa = {}
    for r in torch:
        if r.get("kind") == "sdpa" and r.get("dtype") == "fp32":
            sdpa.setdefault(r["model"], 0.0)
            sdpa[r["model"]] += r["seconds"]
    both = [(m, sdpa[m] / att[m]) for m in att if m in sdpa and att[m] > 0]
    if both:
        m, worst = min(both, key=lambda x: x[1])
        out.append(goal("attention_vs_torch_sdpa_fp32", 0.25, worst, f"worst model {m}; " + ", ".join(f"{k} {v:.4f}" for k, v in both)))
    else:
        out.append(goal("attention_vs_torch_sdpa_fp32", 0.25, None, why=part_note(work, "kernels" if not att else "torch")))

    for link, name in (("h2d", "upload_vs_torch_pinned"), ("d2h", "download_vs_torch_pinned")):
        rows = jsonl(work, f"{link}.out")
        pinned = {r["bytes"]: r["gbps"] for r in torch if r.get("kind") == "copy" and r["direction"] == link and r["memory"] == "pinned"}
        ours = {}
        # Prestaged times the device's copy of bytes staged before the clock: a bound, not a path the
        # trainer takes, so it is not counted as ours; nor is a d2h Pinned read unless the trainer reads
        # back that way: where the tuner chose pinned read-backs (the read-back in the adapter's table
        # when the transfers ran), or in a --copy-queue run that finished (it reads back into pinned
        # memory whatever the table says); the trainer reads through InPlace's mapped buffers otherwise.
        pinned_reads = any(r.get("read_back") == "pinned" for r in jsonl(work, "devices.json") if r.get("preferred"))
        pinned_reads = pinned_reads or any(train_tokens(work, f"{n}-copyq")[0] for n in ("gpt2", "oversized-streamed"))
        not_ours = {"Prestaged"} | ({"Pinned"} if link == "d2h" and not pinned_reads else set())
        for run in (rows[0]["runs"] if rows else []):
            if run["method"] not in not_ours:
                ours[run["bytes"]] = max(ours.get(run["bytes"], (0.0, "")), (run["gbps"], run["method"]))
        common = sorted(set(ours) & set(pinned))
        if common:
            size = common[-1]
            (gbps, method) = ours[size]
            out.append(goal(name, 0.80, gbps / pinned[size], f"{size >> 20} MiB: ours {gbps:.2f} GB/s ({method}), torch pinned {pinned[size]:.2f} GB/s"))
        else:
            out.append(goal(name, 0.80, None, why=part_note(work, link if not ours else "torch")))

    train_torch = {r["dtype"]: r for r in torch if r.get("kind") == "train"}
    for name, run, dtype, target in (("gpt2_124m_fp32_tokens_vs_torch", "gpt2", "fp32", 0.5),
                                     ("gpt2_124m_f16_vs_torch_bf16", "gpt2-f16", "bf16-autocast", 0.3)):
        ours, _, flags = best_train(work, run)
        if ours and dtype in train_torch:
            out.append(goal(name, target, ours / train_torch[dtype]["tokens_per_s"],
                            f"ours {ours:.0f} tokens/s{flags}, torch {train_torch[dtype]['tokens_per_s']:.0f} tokens/s"))
        else:
            out.append(goal(name, target, None, why=part_note(work, f"train-{run}") if not ours else "no torch step: " + part_note(work, "torch")))

    streamed, rows, flags = best_train(work, "oversized-streamed")
    resident, _ = train_tokens(work, "oversized-resident")
    if streamed and resident:
        out.append(goal("oversized_streamed_vs_resident", 0.7, streamed / resident,
                        f"streamed {streamed:.1f}{flags}, resident {resident:.1f} tokens/s"))
    else:
        out.append(goal("oversized_streamed_vs_resident", 0.7, None,
                        why=part_note(work, "train-oversized-streamed" if not streamed else "train-oversized-resident")))
    busy = [r.get("gpu_busy_fraction") for r in rows if r.get("gpu_busy_fraction") is not None]
    if busy:
        out.append(goal("oversized_gpu_busy", 0.9, statistics.mean(busy), f"mean of {len(busy)} steps after the first{flags}, {rows[0].get('tokens', '?')} tokens a step"))
    else:
        out.append(goal("oversized_gpu_busy", 0.9, None,
                        why="no gpu_busy_fraction in the streamed run's metrics (an older binary, no timestamps, or the run failed)"))
    return out


def main():
    work, path = sys.argv[1], sys.argv[2]
    selftest = [r for r in jsonl(work, "selftest.out") if r.get("kind") == "summary"]
    tune = [r for r in jsonl(work, "tune.out") if r.get("kind") == "summary"]
    machine = read(work, "machine.out") or ""
    # The adapter the benches open: the one `devices` marks (older binaries: the first listed).
    listed = [line.split("] ", 1)[1] for line in machine.splitlines() if line.startswith("[") and "] " in line]
    marker = " (opened by --device gpu without --adapter)"
    adapter = next((a.replace(marker, "") for a in listed if marker in a), listed[0] if listed else None)
    binary = next((line[len("binary: "):] for line in machine.splitlines() if line.startswith("binary: ")), None)
    doc = {
        "adapter": adapter,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "binary": binary,
        "selftest": selftest[0] if selftest else {"why": part_note(work, "selftest")},
        "tune": tune[0] if tune else {"why": part_note(work, "tune")},
        "goals": goals(work),
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
