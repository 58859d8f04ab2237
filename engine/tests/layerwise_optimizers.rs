//! `--optimizer lamb` and `--optimizer lars` train GPT-2 as PyTorch does, at one rank and split over
//! two at every stage (each tensor's norms summed across ranks), with one rank's bits at every world
//! size (each tensor's norms put together in one order however the slices cut it), and the overlapped
//! schedule equals the sequential oracle bit for bit.
//!
//! The goldens (`tests/golden/gpt2-tiny-lamb`, `gpt2-tiny-lars`) were made by
//! `tests/golden/gen_golden.py --optimizer lamb --lr 0.01 --grad-accum 2` and
//! `--optimizer lars --lr 0.5 --trust-coefficient 0.02 --grad-accum 2`, with PyTorch 2.15 and the
//! optimizers of `tests/golden/layerwise_torch.py` (the formulas and their papers are there and in
//! `zerostream_offload::layerwise`): the gpt2-tiny model, 2 micro-batches per step, a float64 trajectory.

mod common;

use common::trajectory::{Golden, Run, bits, check_against, run_rank};
use zerostream::comm::Comm;
use zerostream::device::CpuDevice;
use zerostream::train::ranks::in_process;
use zerostream::train::{Optimizer, TrainConfig, ZeroStage};

fn config(golden: &Golden, optimizer: Optimizer) -> TrainConfig {
    let mut tc = golden.train_config();
    tc.optimizer = optimizer;
    if optimizer == Optimizer::Lars {
        tc.momentum = golden.setting("momentum");
        tc.trust_coefficient = golden.setting("trust_coefficient");
    }
    tc
}

/// `tc` on `world` in-process ranks; rank 0's run, after checking every rank agrees bit for bit.
fn run_world(name: &str, world: usize, tc: TrainConfig) -> Run {
    let runs = in_process(world, |comm: Comm| run_rank(&CpuDevice::new(None), name, tc.clone(), comm)).unwrap();
    for (r, other) in runs.iter().enumerate().skip(1) {
        assert!(bits(other) == bits(&runs[0]), "rank {r} disagrees with rank 0");
    }
    runs.into_iter().next().expect("rank 0")
}

fn check(name: &str, optimizer: Optimizer) {
    let golden = Golden::load(name);
    let base = config(&golden, optimizer);
    assert_eq!(base.grad_accum, 2, "the golden's steps hold 2 micro-batches");
    let one = run_world(name, 1, base.clone());
    check_against(&golden, &one, name, "world 1 x accum 2");
    for stage in [ZeroStage::Zero, ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
        let tc = TrainConfig { grad_accum: 1, zero_stage: stage, ..base.clone() };
        let two = run_world(name, 2, tc.clone());
        check_against(&golden, &two, name, &format!("world 2 x accum 1, stage {}", stage.number()));
        let oracle = run_world(name, 2, TrainConfig { sequential: true, ..tc });
        assert!(bits(&two) == bits(&oracle), "{name} stage {}: the overlapped run differs from the sequential one", stage.number());
        assert_same_bits(&two, &one, &format!("{name} world 2 x accum 1, stage {}", stage.number()));
    }
    // Four ranks cut the tensors in other places (a slice may start inside a norm block).
    let four = TrainConfig { grad_accum: 4, ..base };
    let oracle = run_world(name, 1, four.clone());
    for stage in [ZeroStage::Zero, ZeroStage::Three] {
        let got = run_world(name, 4, TrainConfig { grad_accum: 1, zero_stage: stage, ..four.clone() });
        assert_same_bits(&got, &oracle, &format!("{name} world 4 x accum 1 against world 1 x accum 4, stage {}", stage.number()));
    }
}

/// Losses, final weights and grad norms bit for bit.
fn assert_same_bits(got: &Run, want: &Run, what: &str) {
    assert!(bits(got) == bits(want), "{what}: losses or final weights differ");
    let norm_bits = |r: &Run| r.norms.iter().map(|n| n.to_bits()).collect::<Vec<_>>();
    assert_eq!(norm_bits(got), norm_bits(want), "{what}: grad norms differ");
    println!("[{what}] the same bits");
}

#[test]
fn lamb_matches_pytorch_at_every_world_size_and_stage() {
    check("gpt2-tiny-lamb", Optimizer::Lamb);
}

#[test]
fn lars_matches_pytorch_at_every_world_size_and_stage() {
    check("gpt2-tiny-lars", Optimizer::Lars);
}

#[test]
fn the_goldens_differ_from_adamw_so_the_rule_is_really_used() {
    // A test of the test: AdamW on the LAMB golden's settings must miss it.
    let name = "gpt2-tiny-lamb";
    let golden = Golden::load(name);
    let got = run_world(name, 1, config(&golden, Optimizer::Adamw));
    let result = std::panic::catch_unwind(|| check_against(&golden, &got, name, "adamw"));
    assert!(result.is_err(), "AdamW reproduced the LAMB golden");
}

/// `bench adam --optimizer lamb|lars` times the two passes and counts their bytes, with f32 gradients
/// by default; 16-bit gradients asked for are refused by name (the layer-wise rules read f32).
#[test]
fn bench_adam_times_lamb_and_lars() {
    let bench = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_zerostream"))
            .args(["bench", "adam", "--params", "100000", "--reps", "1", "--json"])
            .args(args)
            .output()
            .expect("running zerostream")
    };
    for (optimizer, bytes_per_param) in [("lamb", 42), ("lars", 30)] {
        let out = bench(&["--optimizer", optimizer, "--grad", "f32"]);
        assert!(out.status.success(), "{optimizer}: {}", String::from_utf8_lossy(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(r["optimizer"], optimizer);
        assert_eq!(r["bytes_per_param"], bytes_per_param, "{optimizer}: {r}");
        assert!(r["gparams_per_s"].as_f64().unwrap() > 0.0, "{optimizer}: {r}");
        // f32 gradients are their default; 16-bit ones asked for are refused by name.
        assert!(bench(&["--optimizer", optimizer]).status.success(), "{optimizer} with its default gradients");
        let out = bench(&["--optimizer", optimizer, "--grad", "bf16"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--grad f32"), "{optimizer}: {err}");
    }
    // Its progress lines go to stderr, and not under --quiet.
    for (quiet, said) in [(false, true), (true, false)] {
        let out = bench(if quiet { &["--quiet"] } else { &[] });
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.contains("bench adam: ") == said, "--quiet {quiet}: {err}");
    }
}
