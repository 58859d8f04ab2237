//! ZeRO ranks in one process: world sizes 2 and 4 at every stage reproduce PyTorch's gpt2-tiny-accum
//! trajectory (2 micro-batches per step) on the cpu device and on the GPU; runs are bit-identical across
//! tiers; a failing rank stops the others with its error; collectives are exact.
//!
//! The golden holds 2 micro-batches per step, so world 2 x accum 1 is checked against it directly; world
//! 4 x accum 1 and world 2 x accum 2 (4 micro-batches per step) are checked against the one-rank run of
//! world 1 x accum 4, which follows the same contract (tests/train.rs ties that one to PyTorch): bit for
//! bit at every stage with one micro-batch per rank and at stages 2-3 with several, within fp32
//! rounding at stages 0-1 with several (they sum a rank's micro-batches before the exchange).

mod common;

use anyhow::Result;
use common::gpu_or_skip;
use common::trajectory::{Golden, Run, bits, check_against, run_rank};
use zerostream::comm::Comm;
use zerostream::device::{CpuDevice, GpuDevice};
use zerostream::train::ranks::in_process;
use zerostream::train::{TrainConfig, ZeroStage};
use zerostream_offload::Tier;

const GOLDEN: &str = "gpt2-tiny-accum";
/// Bytes of a rank's share of the global norm: `SquareSums::to_words`, 512 u64.
const NORM_BYTES: usize = 512 * 8;
const STAGES: [ZeroStage; 4] = [ZeroStage::Zero, ZeroStage::One, ZeroStage::Two, ZeroStage::Three];

#[derive(Clone, Copy, PartialEq)]
enum Dev {
    Cpu,
    Gpu,
}

/// Runs `tc` on `world` in-process ranks; returns rank 0's run after checking every rank saw the same
/// losses and final weights.
fn run_world(dev: Dev, world: usize, tc: TrainConfig) -> Result<Run> {
    let runs = in_process(world, |comm: Comm| match dev {
        Dev::Cpu => run_rank(&CpuDevice::new(tc.gpu_mem_budget), GOLDEN, tc.clone(), comm),
        Dev::Gpu => run_rank(&GpuDevice::open(None, tc.gpu_mem_budget)?, GOLDEN, tc.clone(), comm),
    })?;
    for (r, other) in runs.iter().enumerate().skip(1) {
        assert!(bits(other) == bits(&runs[0]), "rank {r} disagrees with rank 0 on losses or final weights");
    }
    Ok(runs.into_iter().next().expect("rank 0"))
}

fn with(tc: &TrainConfig, accum: usize, stage: ZeroStage) -> TrainConfig {
    TrainConfig { grad_accum: accum, zero_stage: stage, ..tc.clone() }
}

fn check_every_world_and_stage(dev: Dev, label: &str) {
    let golden = Golden::load(GOLDEN);
    let base = golden.train_config();
    assert_eq!(base.grad_accum, 2, "the golden's steps hold 2 micro-batches");
    for stage in STAGES {
        let got = run_world(dev, 2, with(&base, 1, stage)).unwrap();
        check_against(&golden, &got, GOLDEN, &format!("{label} world 2 x accum 1, stage {}", stage.number()));
    }
    // Four micro-batches per step: the one-rank oracle, then world 2 x 2 and world 4 x 1 against it.
    let oracle = run_world(dev, 1, with(&base, 4, ZeroStage::Two)).unwrap();
    for (world, accum) in [(2, 2), (4, 1)] {
        for stage in STAGES {
            let got = run_world(dev, world, with(&base, accum, stage)).unwrap();
            let what = format!("{label} world {world} x accum {accum}, stage {}", stage.number());
            // Summed in the micro-batches' global order, as one rank sums them: wherever each
            // micro-batch's gradient is exchanged on its own (stages 2-3), or there is one per rank.
            if accum == 1 || matches!(stage, ZeroStage::Two | ZeroStage::Three) {
                assert!(bits(&got) == bits(&oracle), "{what}: losses or final weights differ from world 1 x accum 4's bits");
                let norm_bits = |r: &common::trajectory::Run| r.norms.iter().map(|n| n.to_bits()).collect::<Vec<_>>();
                assert_eq!(norm_bits(&got), norm_bits(&oracle), "{what}: grad norms differ from world 1 x accum 4's bits");
                println!("[{what}] equals world 1 x accum 4 bit for bit");
                continue;
            }
            // Stages 0-1 sum a rank's micro-batches first and exchange once a step.
            let mut worst = (0.0f64, 0.0f64);
            for (s, (a, b)) in got.losses.iter().zip(&oracle.losses).enumerate() {
                let e = (a - b).abs() / b.abs();
                assert!(e < 1e-5, "{what}: step {s} loss {a} vs world 1 x accum 4 {b}");
                worst.0 = worst.0.max(e);
            }
            for (s, (a, b)) in got.norms.iter().zip(&oracle.norms).enumerate() {
                let e = (a - b).abs() / b.abs();
                assert!(e < 1e-4, "{what}: step {s} grad norm {a} vs world 1 x accum 4 {b}");
                worst.1 = worst.1.max(e);
            }
            println!("[{what}] against world 1 x accum 4: worst relative error loss {:.2e}, grad norm {:.2e}", worst.0, worst.1);
        }
    }
}

#[test]
fn every_world_size_and_stage_matches_pytorch_on_cpu() {
    check_every_world_and_stage(Dev::Cpu, "cpu");
}

#[test]
fn every_world_size_and_stage_matches_pytorch_on_gpu() {
    if let Some(gpu) = gpu_or_skip("every_world_size_and_stage_matches_pytorch_on_gpu") {
        let label = zerostream::device::Backend::describe(&gpu);
        drop(gpu);
        check_every_world_and_stage(Dev::Gpu, &label);
    }
}

#[test]
fn sharded_runs_are_bit_identical_across_tiers_budgets_and_recompute() {
    let golden = Golden::load(GOLDEN);
    let base = TrainConfig { steps: 3, ..with(&golden.train_config(), 1, ZeroStage::Three) };
    let reference = run_world(Dev::Cpu, 2, base.clone()).unwrap();
    let nvme = tempfile::tempdir().unwrap();
    let on_nvme =
        TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, nvme_dirs: vec![nvme.path().into()], ..base.clone() };
    let got = run_world(Dev::Cpu, 2, on_nvme).unwrap();
    assert!(bits(&got) == bits(&reference), "stage 3 with everything on NVMe differs from the all-in-RAM run");
    for r in 0..2 {
        let dir = nvme.path().join(format!("rank{r}"));
        assert!(std::fs::read_dir(&dir).unwrap().count() > 0, "rank {r} has its own NVMe subdirectory {}", dir.display());
    }
    let got = run_world(Dev::Cpu, 2, TrainConfig { recompute: true, ..base.clone() }).unwrap();
    assert!(bits(&got) == bits(&reference), "stage 3 with --recompute differs");
    let got = run_world(Dev::Cpu, 2, TrainConfig { sequential: true, ..base.clone() }).unwrap();
    assert!(bits(&got) == bits(&reference), "stage 3: the overlapped schedule differs from the strictly sequential one");
    if let Some(gpu) = gpu_or_skip("sharded_runs_are_bit_identical (gpu part)") {
        let pinning = gpu.host_staging_unavailable();
        drop(gpu);
        let overlapped = run_world(Dev::Gpu, 2, base.clone()).unwrap();
        let sequential = run_world(Dev::Gpu, 2, TrainConfig { sequential: true, ..base.clone() }).unwrap();
        assert!(bits(&overlapped) == bits(&sequential), "gpu stage 3: the overlapped schedule differs from the sequential one");
        // Stage 2's gather completes each rank's pinned working copy in place before its upload.
        match pinning {
            None => {
                let stage2 = TrainConfig { zero_stage: ZeroStage::Two, ..base.clone() };
                let pinned = run_world(Dev::Gpu, 2, stage2.clone()).unwrap();
                let plain = run_world(Dev::Gpu, 2, TrainConfig { pin_memory: false, ..stage2 }).unwrap();
                assert!(bits(&pinned) == bits(&plain), "gpu stage 2: pinned working copies changed the run");
            }
            Some(why) => eprintln!("SKIPPED sharded_runs_are_bit_identical (gpu stage 2, pinned): no host-memory buffers here ({why})"),
        }
    }
    // bf16 working copies, gathered as 16-bit words: every sharded stage gives the same run. Stage 0
    // has the same gradient sums but adds the norm's squares in another order (the whole group's,
    // not each rank's slice and then the ranks), so it is held to the losses.
    let bf16 = TrainConfig { precision: zerostream::train::Precision::Bf16, ..base.clone() };
    let runs: Vec<_> = STAGES.iter().map(|&s| run_world(Dev::Cpu, 2, TrainConfig { zero_stage: s, ..bf16.clone() }).unwrap()).collect();
    let stage2 = &runs[2];
    for (s, r) in STAGES.iter().zip(&runs) {
        assert!(bits(r) == bits(stage2), "bf16 stage {} differs from stage 2 (accum 1: same sums, the norm exact)", s.number());
    }
    // fp16 with dynamic loss scaling: stage 0 checks the whole gradient for overflow on every rank
    // (agreed with `any`) and unscales it as stage 2 does its slices, so the two stay together.
    let fp16 = TrainConfig { precision: zerostream::train::Precision::Fp16, ..base.clone() };
    let zero = run_world(Dev::Cpu, 2, TrainConfig { zero_stage: ZeroStage::Zero, ..fp16.clone() }).unwrap();
    let two = run_world(Dev::Cpu, 2, TrainConfig { zero_stage: ZeroStage::Two, ..fp16 }).unwrap();
    assert!(zero.losses.iter().all(|l| l.is_finite()), "fp16 stage 0: losses {:?}", zero.losses);
    for (a, b) in zero.losses.iter().zip(&two.losses) {
        assert!((a - b).abs() <= 1e-6 * b.abs(), "fp16 stage 0: loss {a} against stage 2's {b}");
    }
}

/// Bytes sent per step match the ZeRO volumes: with Ψ the padded parameter count and N ranks, every
/// stage reduce-scatters the gradients ((N-1)/N x 4Ψ bytes); stages 1-2 all-gather the updated working
/// copy once per step from step 1 on, and stage 3 gathers it before each upload (once per step here,
/// where every block stays resident between forward and backward); stage 0 gathers the reduced
/// gradients instead, once a step whatever the accumulation; plus the norm's sums, the overflow flag and the
/// micro-batches' losses (the flag and the losses in stage 0).
#[test]
fn comm_bytes_match_the_zero_volumes() {
    let golden = Golden::load(GOLDEN);
    let hf = zerostream_checkpoints::HfModel::open(&common::trajectory::golden_dir(GOLDEN).join("model")).unwrap();
    let model = zerostream::model::Model::of_hf(&hf).unwrap();
    for world in [2usize, 4] {
        let psi: usize = zerostream::train::layout::group_layouts(&model)
            .iter()
            .map(|g| zerostream::train::Sharding { rank: 0, world, stage: ZeroStage::Two }.group(g.len).padded_len)
            .sum();
        let share = |bytes_per_param: usize| ((world - 1) * psi / world * bytes_per_param) as u64;
        // The global norm's exact sums of squares (512 words), the overflow flag, the micro-batch's loss.
        let scalars = ((world - 1) * (NORM_BYTES + 1 + 4)) as u64;
        for stage in STAGES {
            for precision in [zerostream::train::Precision::Fp32, zerostream::train::Precision::Bf16] {
                let tc = TrainConfig { steps: 3, precision, ..with(&golden.train_config(), 1, stage) };
                let got = run_world(Dev::Cpu, world, tc).unwrap();
                let reduce = share(4); // f32 gradients (one micro-batch per rank here)
                let gather = share(precision.working_bytes_per_param());
                let first = if stage == ZeroStage::Three { reduce + gather } else { reduce };
                let mut want = [first + scalars, reduce + gather + scalars, reduce + gather + scalars];
                if stage == ZeroStage::Zero {
                    // The gradients all-reduced (their sums gathered after the reduce-scatter), no
                    // working copy; the norm's sum of squares is every rank's own.
                    want = [2 * reduce + scalars - ((world - 1) * NORM_BYTES) as u64; 3];
                }
                assert_eq!(got.comm_bytes, want, "world {world} stage {} {precision:?}: bytes sent per step", stage.number());
            }
        }
        // Stage 0 sums a rank's micro-batches locally and all-reduces once a step, however many.
        let tc = TrainConfig { steps: 2, ..with(&golden.train_config(), 2, ZeroStage::Zero) };
        let got = run_world(Dev::Cpu, world, tc).unwrap();
        assert_eq!(got.comm_bytes, [2 * share(4) + ((world - 1) * (1 + 2 * 4)) as u64; 2], "world {world} stage 0, 2 micro-batches a step");
        println!(
            "world {world}: comm bytes per step = 2 x (N-1)/N x Ψ bytes in fp32 (Ψ = {psi} padded parameters), as ZeRO says (stage 0: the all-reduce's)"
        );
    }
}

#[test]
fn ranks_started_with_different_configurations_are_refused() {
    let golden = Golden::load(GOLDEN);
    let base = with(&golden.train_config(), 1, ZeroStage::Two);
    let err = in_process(2, |comm: Comm| {
        let lr = if comm.rank() == 1 { 2e-3 } else { 1e-3 };
        let tc = TrainConfig { lr: zerostream::train::LrPlan { peak: lr, ..base.lr }, ..base.clone() };
        run_rank(&CpuDevice::new(None), GOLDEN, tc, comm)
    })
    .err()
    .expect("a mismatch is refused");
    assert!(format!("{err:#}").contains("ranks [1] were given other values of --lr than rank 0;"), "{err:#}");
}

#[test]
fn a_failing_rank_stops_every_rank_with_its_error() {
    let start = std::time::Instant::now();
    let err = in_process(3, |comm: Comm| -> Result<()> {
        if comm.rank() == 1 {
            anyhow::bail!("disk on fire");
        }
        // The others wait in collectives that rank 1 never joins.
        loop {
            comm.barrier()?;
        }
    })
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("rank 1") && text.contains("disk on fire"), "{text}");
    assert!(start.elapsed().as_secs() < 10, "the other ranks stopped within seconds");

    let err = in_process(2, |comm: Comm| -> Result<()> {
        if comm.rank() == 0 {
            panic!("rank zero's bug");
        }
        comm.barrier()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("rank zero's bug"), "{err:#}");
}

#[test]
fn collectives_sum_in_rank_order_and_count_their_bytes() {
    let world = 3;
    let n = 1000; // elements per rank's slice: not a multiple of anything convenient
    let results = in_process(world, |comm: Comm| -> Result<(Vec<f32>, Vec<u16>, f64, u64)> {
        let r = comm.rank();
        let full: Vec<f32> = (0..world * n).map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.1 + r as f32 * 1e-7).collect();
        let mut mine = vec![0.0; n];
        comm.reduce_scatter_sum(&full, &mut mine, false)?;
        let words: Vec<u16> = (0..n).map(|i| (i + r * n) as u16).collect();
        let mut all = vec![0u16; world * n];
        comm.all_gather(&words, &mut all, false)?;
        let total = comm.sum_f64(0.1 * (r + 1) as f64)?;
        Ok((mine, all, total, comm.stats().sent_bytes))
    })
    .unwrap();
    for (r, (mine, all, total, sent)) in results.iter().enumerate() {
        for (i, &got) in mine.iter().enumerate() {
            let part = |s: usize| ((((r * n + i) * 7 + s * 13) % 101) as f32 * 0.1) + s as f32 * 1e-7;
            let want = (part(0) + part(1)) + part(2);
            assert_eq!(got.to_bits(), want.to_bits(), "rank {r} element {i}: the sum in rank order");
        }
        assert!(all.iter().enumerate().all(|(i, &w)| w == i as u16), "rank {r}: all-gather puts rank s's slice at s");
        assert_eq!(total.to_bits(), ((0.1f64 + 0.2) + 0.30000000000000004).to_bits());
        let expected = (world - 1) * n * 4 + (world - 1) * n * 2 + (world - 1) * 8;
        assert_eq!(*sent, expected as u64, "rank {r}: bytes sent to other ranks");
    }
}
