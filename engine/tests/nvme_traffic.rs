//! The NVMe traffic `plan` and `train` print (`train::traffic`, from the step's schedule and the
//! placement) against the metrics of real runs: with `--sequential` every step's `nvme_read_bytes` and
//! `nvme_written_bytes` equal the prediction exactly, whatever lives where, for one rank and for rank
//! 0 of two in each ZeRO stage (also with a compressed exchange, whose residuals live with the
//! gradients); overlapped, the update's sweep runs into the next step, so the run's
//! total lies between the steps' traffic without the last sweep and with it. Striped over two
//! directories, a run moves the same bytes, splits them equally, and gives the same bits.

mod common;

use common::trajectory::{Golden, Run, run, run_rank};
use zerostream::comm::Comm;
use zerostream::comm::compress::GradCompression;
use zerostream::device::{AllocCosts, CpuDevice};
use zerostream::train::ranks::in_process;
use zerostream::train::{Precision, TrainConfig, ZeroStage};
use zerostream_offload::Tier;

const GOLDEN: &str = "gpt2-tiny-accum";

fn on_nvme(base: &TrainConfig, dir: &tempfile::TempDir) -> TrainConfig {
    TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, nvme_dirs: vec![dir.path().into()], ..base.clone() }
}

/// Every step of a sequential run from `first_step` on read and wrote exactly what was predicted.
fn assert_exact(what: &str, got: &Run, first_step: usize) {
    let want = got.predicted_nvme.total();
    assert!(want.read_bytes > 0 && want.written_bytes > 0, "{what}: nothing predicted");
    for (step, &(read, written)) in got.nvme_bytes.iter().enumerate().skip(first_step) {
        let by_kind = got.predicted_nvme;
        assert_eq!((read, written), (want.read_bytes, want.written_bytes), "{what}: step {step} (read, written) against {by_kind:?}");
    }
}

#[test]
fn sequential_steps_move_exactly_the_predicted_bytes() {
    let golden = Golden::load(GOLDEN);
    let base = TrainConfig { steps: 3, sequential: true, ..golden.train_config() };
    let dirs: Vec<tempfile::TempDir> = (0..6).map(|_| tempfile::tempdir().unwrap()).collect();
    let nvme = on_nvme(&base, &dirs[0]);
    let variants = [
        ("everything on nvme, every block resident", nvme.clone()),
        ("two block slots: blocks re-read for the backward", TrainConfig { recompute: true, gpu_mem_budget: Some(0), ..nvme.clone() }),
        ("gradients in ram", TrainConfig { offload_gradients: Some(Tier::Ram), ..nvme.clone() }),
        ("gradients alone on nvme", TrainConfig { offload_gradients: Some(Tier::Nvme), nvme_dirs: nvme.nvme_dirs.clone(), ..base.clone() }),
        ("bf16 working copy", TrainConfig { precision: Precision::Bf16, ..nvme.clone() }),
        ("four micro-batches", TrainConfig { grad_accum: 4, ..nvme.clone() }),
    ];
    for (i, (what, mut tc)) in variants.into_iter().enumerate() {
        // A directory each: shards of another size are refused.
        tc.nvme_dirs = vec![dirs[i].path().into()];
        if tc.gpu_mem_budget == Some(0) {
            let model = zerostream::model::Model::of_hf(
                &zerostream_checkpoints::HfModel::open(&common::trajectory::golden_dir(GOLDEN).join("model")).unwrap(),
            )
            .unwrap();
            tc.gpu_mem_budget = Some(zerostream::train::minimum_device_bytes_on(&model, &tc, AllocCosts::CPU));
        }
        let got = run(&CpuDevice::new(tc.gpu_mem_budget), GOLDEN, tc);
        assert_exact(what, &got, 0);
    }
}

#[test]
fn rank_zero_of_two_moves_exactly_the_predicted_bytes_in_every_stage() {
    let golden = Golden::load(GOLDEN);
    for stage in [ZeroStage::Zero, ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
        let dir = tempfile::tempdir().unwrap();
        // Step 0 gathers nothing (every rank starts with the whole working copy), so it moves less than a
        // steady step in stages 1-2; the steps after it are steady.
        let tc = TrainConfig { steps: 3, sequential: true, grad_accum: 1, zero_stage: stage, ..on_nvme(&golden.train_config(), &dir) };
        let runs = in_process(2, |comm: Comm| run_rank(&CpuDevice::new(None), GOLDEN, tc.clone(), comm)).unwrap();
        assert_exact(&format!("stage {} rank 0", stage.number()), &runs[0], 1);
        // A compressed exchange reads and writes each group's error-feedback residual on the gradients' tier.
        let dir = tempfile::tempdir().unwrap();
        let compressed = TrainConfig { grad_compression: GradCompression::Int8, grad_accum: 2, nvme_dirs: vec![dir.path().into()], ..tc };
        let runs = in_process(2, |comm: Comm| run_rank(&CpuDevice::new(None), GOLDEN, compressed.clone(), comm)).unwrap();
        let residuals = runs[0].predicted_nvme.gradients;
        assert_exact(&format!("stage {} rank 0, int8 exchange, 2 micro-batches (gradients {residuals:?})", stage.number()), &runs[0], 1);
    }
}

/// Overlapped: every step but the first takes each group's first upload from the sweep's fresh copy
/// (the first, which no sweep precedes, reads them), and at most the last step's sweep is missing from
/// the run's total. The bits are the sequential run's.
#[test]
fn overlapped_runs_move_the_predicted_bytes_but_for_the_first_forward_and_the_last_sweep() {
    let golden = Golden::load(GOLDEN);
    let dir = tempfile::tempdir().unwrap();
    let tc = TrainConfig { steps: 8, ..on_nvme(&golden.train_config(), &dir) };
    let got = run(&CpuDevice::new(None), GOLDEN, tc.clone());
    let t = got.predicted_nvme;
    let steps = got.nvme_bytes.len() as u64;
    let (read, written) = got.nvme_bytes.iter().fold((0, 0), |(r, w), &(a, b)| (r + a, w + b));
    let total = t.total();
    assert!(t.fresh_working_bytes > 0, "{t:?}");
    let first_forward = t.fresh_working_bytes;
    // The last sweep's reads: the optimizer state and the gradients (bounded by all the step's gradient
    // reads); its writes: the state and the working copy.
    let sweep_read = t.optimizer.read_bytes + t.gradients.read_bytes;
    let sweep_written = t.optimizer.written_bytes + t.working.written_bytes;
    let want_read = steps * total.read_bytes + first_forward;
    assert!(
        read <= want_read && read + sweep_read >= want_read,
        "read {read} over {steps} steps of {total:?}, first forward {first_forward}"
    );
    assert!(
        written <= steps * total.written_bytes && written + sweep_written >= steps * total.written_bytes,
        "written {written} over {steps} steps of {total:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let sequential = run(&CpuDevice::new(None), GOLDEN, TrainConfig { sequential: true, nvme_dirs: vec![dir.path().into()], ..tc });
    assert_eq!(sequential.losses, got.losses, "the fresh copies change no bit");
    assert!(sequential.final_params == got.final_params, "the fresh copies change no bit of the weights");
}

/// `--nvme-dir A,B`: the run's bits and bytes are one directory's; each directory holds an equal share
/// of every tensor (within a page per shard file), so each drive moves an equal share of every sweep.
#[test]
fn two_directories_share_every_tensor_equally_and_change_nothing() {
    let golden = Golden::load(GOLDEN);
    let base = TrainConfig { steps: 3, sequential: true, ..golden.train_config() };
    let one = tempfile::tempdir().unwrap();
    let single = run(&CpuDevice::new(None), GOLDEN, on_nvme(&base, &one));
    let two = tempfile::tempdir().unwrap();
    let dirs = vec![two.path().join("a"), two.path().join("b")];
    let striped = run(&CpuDevice::new(None), GOLDEN, TrainConfig { nvme_dirs: dirs.clone(), ..on_nvme(&base, &one) });
    assert!(common::trajectory::bits(&striped) == common::trajectory::bits(&single), "striping changed the run");
    assert_eq!(striped.nvme_bytes, single.nvme_bytes, "striping changed the bytes moved");
    assert_exact("striped over two directories", &striped, 0);
    // The same shard files in both directories, with equal data within a page each.
    let files = |d: &std::path::Path| -> std::collections::BTreeMap<String, u64> {
        std::fs::read_dir(d.join("rank0"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
            .collect()
    };
    let (a, b) = (files(&dirs[0]), files(&dirs[1]));
    assert!(!a.is_empty());
    for (name, size_a) in &a {
        // A tensor under two pages has one stripe only.
        if let Some(size_b) = b.get(name) {
            assert!(size_a.abs_diff(*size_b) <= 4096, "{name}: {size_a} in one directory, {size_b} in the other");
        }
    }
    let (total_a, total_b) = (a.values().sum::<u64>(), b.values().sum::<u64>());
    println!("striped over two directories: {total_a} and {total_b} bytes of shard files");
}

/// The golden's model grown to six blocks (two device slots then evict four), and its tokens.
fn six_block_model() -> (zerostream::model::Model, zerostream_checkpoints::TokenFile) {
    let dir = common::trajectory::golden_dir(GOLDEN);
    let hf = zerostream_checkpoints::HfModel::open(&dir.join("model")).unwrap();
    (
        zerostream::model::Model::of_hf(&hf).unwrap().with_layers(6),
        zerostream_checkpoints::TokenFile::open(&dir.join("tokens.bin")).unwrap(),
    )
}

/// `--params-ram-cache`: the blocks evicted from their device slots between forward and backward keep
/// their working copy in RAM, the nearest the turn first, so their backward upload reads nothing. The
/// bits are those without it; every sequential step moves exactly the predicted, fewer, bytes; with
/// room for every evicted block each group's working copy is read once a step.
#[test]
fn a_ram_cache_for_the_working_copy_reads_each_block_once_and_changes_nothing() {
    use zerostream::train::{ModelSource, Trainer};
    let golden = Golden::load(GOLDEN);
    let (model, tokens) = six_block_model();
    let nvme = tempfile::tempdir().unwrap();
    let mut base = TrainConfig { steps: 3, sequential: true, recompute: true, ..on_nvme(&golden.train_config(), &nvme) };
    base.gpu_mem_budget = Some(zerostream::train::minimum_device_bytes_on(&model, &base, AllocCosts::CPU));
    let train = |tc: TrainConfig| {
        let dev = CpuDevice::new(tc.gpu_mem_budget);
        let mut trainer = Trainer::new(&dev, &ModelSource::Random { model: model.clone(), seed: 5 }, tc).unwrap();
        let reports: Vec<_> = (0..3).map(|_| trainer.train_step(&tokens).unwrap()).collect();
        let bits: Vec<u64> = reports.iter().flat_map(|r| [r.loss.to_bits(), r.grad_norm.to_bits()]).collect();
        let bytes: Vec<(u64, u64)> = reports.iter().map(|r| (r.nvme_read_bytes, r.nvme_written_bytes)).collect();
        let placement = trainer.placement().clone();
        trainer.finish().unwrap();
        (bits, bytes, placement)
    };
    let (bits, _, uncached) = train(base.clone());
    assert_eq!(uncached.block_slots, 2, "two slots: four of the six blocks are evicted before their backward");
    assert!(uncached.cached_working_blocks.is_empty(), "{:?}", uncached.cached_working_blocks);
    // fp32 working copy, one rank: a block's words as the trainer keeps them (padded).
    let sharding = zerostream::train::Sharding { rank: 0, world: 1, stage: base.zero_stage };
    let block_bytes = 4 * sharding.group(uncached.group_lens[1]).working_len as u64;
    // (what, cache, blocks held, sequential, micro-batches): the golden's two micro-batches each
    // re-read the evicted blocks in their backward.
    let cases = [
        ("room for one block", block_bytes, 3..4, true, 2),
        ("room for every block", 1 << 30, 0..4, true, 2),
        ("room for every block, overlapped", 1 << 30, 0..4, false, 2),
        ("room for every block, one micro-batch", 1 << 30, 0..4, true, 1),
    ];
    for (what, cache_bytes, blocks, sequential, grad_accum) in cases {
        let uncached = if grad_accum == base.grad_accum && sequential {
            uncached.clone()
        } else {
            train(TrainConfig { grad_accum, sequential, ..base.clone() }).2
        };
        let tc = TrainConfig { params_ram_cache_bytes: cache_bytes, sequential, grad_accum, ..base.clone() };
        let (got_bits, got_bytes, placement) = train(tc);
        if grad_accum == base.grad_accum {
            assert!(got_bits == bits, "{what}: the cache changed the run");
        }
        assert_eq!(placement.cached_working_blocks, blocks, "{what}");
        let (want, before) = (placement.nvme_traffic, uncached.nvme_traffic);
        // Later micro-batches find blocks 0 and 1 still in their slots from the backward before: not
        // uploaded in their forward, so not held for their backward either.
        let later = blocks.clone().filter(|&b| b >= 2).count();
        let saved = (blocks.len() + (grad_accum - 1) * later) as u64 * block_bytes;
        assert_eq!(before.working.read_bytes - want.working.read_bytes, saved, "{what}: {want:?}");
        if sequential {
            for (step, &(read, written)) in got_bytes.iter().enumerate() {
                assert_eq!((read, written), (want.total().read_bytes, want.total().written_bytes), "{what}: step {step}");
            }
        } else {
            // Overlapped, the last step's sweep runs past the run, and the first forward reads what later
            // ones take from the sweep's fresh copies: at most the predicted bytes and those.
            let read = got_bytes.iter().map(|b| b.0).sum::<u64>();
            let most = 3 * want.total().read_bytes + want.fresh_working_bytes;
            assert!(read <= most, "{what}: {read} bytes read in 3 steps of {want:?}");
        }
        if blocks.start == 0 && grad_accum == 1 {
            assert_eq!(want.working.read_bytes, placement.host_working_bytes, "{what}: each group's working copy read once a step");
        }
    }
}

/// `--params-ram-cache auto` sizes the cache from the RAM available: a small model's evicted blocks
/// all fit here, and `plan` names them; a size that is neither bytes nor `auto` is refused by name.
#[test]
fn an_automatic_ram_cache_holds_the_evicted_blocks_that_fit() {
    use common::cli::{path, stderr, zerostream};
    let dir = tempfile::tempdir().unwrap();
    let nvme = path(dir.path());
    let base = ["plan", "--device", "cpu", "--offload-params", "nvme", "--nvme-dir", &nvme];
    let refused = zerostream(&[&base[..], &["--gpu-mem-budget", "1"]].concat());
    let said = stderr(&refused);
    let at = said.find("the minimum of ").unwrap_or_else(|| panic!("{said}")) + "the minimum of ".len();
    let minimum = said[at..].split_whitespace().next().unwrap().to_string();
    let plan = |cache: &str| zerostream(&[&base[..], &["--gpu-mem-budget", &minimum, "--params-ram-cache", cache]].concat());
    let (auto, none) = (plan("auto"), plan("0"));
    assert!(auto.status.success() && none.status.success(), "{}{}", stderr(&auto), stderr(&none));
    let (auto, none) = (String::from_utf8_lossy(&auto.stdout), String::from_utf8_lossy(&none.stdout));
    assert!(auto.contains("kept in RAM from forward to backward by --params-ram-cache"), "{auto}");
    assert!(!none.contains("kept in RAM"), "{none}");
    let bogus = plan("lots");
    assert_eq!(bogus.status.code(), Some(2));
    assert!(stderr(&bogus).contains("--params-ram-cache"), "{}", stderr(&bogus));
}

/// Stages 1-2 with two ranks: the forward upload that gathers a block's working copy keeps it in the
/// RAM cache for the backward (writing it back after), so with room for every evicted block each
/// group is read once a step and written back once, exactly as predicted, with the bits unchanged.
#[test]
fn two_ranks_keep_a_gathered_working_copy_for_the_backward() {
    use zerostream::train::{ModelSource, Trainer};
    let golden = Golden::load(GOLDEN);
    let (model, tokens) = six_block_model();
    for stage in [ZeroStage::One, ZeroStage::Two] {
        let run = |cache_bytes: u64| {
            let nvme = tempfile::tempdir().unwrap();
            let mut tc = TrainConfig {
                steps: 3,
                sequential: true,
                recompute: true,
                grad_accum: 1,
                zero_stage: stage,
                params_ram_cache_bytes: cache_bytes,
                ..on_nvme(&golden.train_config(), &nvme)
            };
            tc.gpu_mem_budget = Some(zerostream::train::minimum_device_bytes_on(&model, &tc, AllocCosts::CPU));
            let ranks = in_process(2, |comm: Comm| {
                let dev = CpuDevice::new(tc.gpu_mem_budget);
                let mut trainer = Trainer::with_comm(&dev, &ModelSource::Random { model: model.clone(), seed: 5 }, tc.clone(), comm)?;
                let reports: Vec<_> = (0..3).map(|_| trainer.train_step(&tokens)).collect::<anyhow::Result<_>>()?;
                let placement = trainer.placement().clone();
                trainer.finish()?;
                Ok((reports, placement))
            })
            .unwrap();
            let (reports, placement) = ranks.into_iter().next().unwrap();
            let bits: Vec<u64> = reports.iter().flat_map(|r| [r.loss.to_bits(), r.grad_norm.to_bits()]).collect();
            let bytes: Vec<(u64, u64)> = reports.iter().map(|r| (r.nvme_read_bytes, r.nvme_written_bytes)).collect();
            (bits, bytes, placement)
        };
        let what = format!("stage {}", stage.number());
        let (bits, _, uncached) = run(0);
        let (cached_bits, bytes, placement) = run(1 << 30);
        assert_eq!(cached_bits, bits, "{what}: the cache changed the run");
        assert_eq!(placement.cached_working_blocks, 0..4, "{what}");
        let (want, before) = (placement.nvme_traffic, uncached.nvme_traffic);
        assert_eq!(want.working.read_bytes, placement.host_working_bytes, "{what}: each group read once a step");
        assert_eq!(want.working.written_bytes, before.working.written_bytes, "{what}: the gathered copies still written back");
        // Step 0 gathers nothing (every rank starts whole); the steps after it are steady.
        for (step, &got) in bytes.iter().enumerate().skip(1) {
            assert_eq!(got, (want.total().read_bytes, want.total().written_bytes), "{what}: step {step} against {want:?}");
        }
    }
}

/// What a forward-only validation or a step's last backward upload holds in the RAM cache is let go
/// before the update, so no held copy outlives its step: after a one-batch validation, and with two
/// micro-batches (whose second backward takes blocks still in their slots for a forward), every later
/// sequential step moves exactly the predicted bytes.
#[test]
fn nothing_held_in_the_ram_cache_outlives_its_step() {
    use zerostream::train::{ModelSource, Trainer};
    let golden = Golden::load(GOLDEN);
    let (model, tokens) = six_block_model();
    for grad_accum in [1, 2] {
        let nvme = tempfile::tempdir().unwrap();
        let mut tc = TrainConfig { steps: 3, sequential: true, recompute: true, grad_accum, ..on_nvme(&golden.train_config(), &nvme) };
        tc.gpu_mem_budget = Some(zerostream::train::minimum_device_bytes_on(&model, &tc, AllocCosts::CPU));
        tc.params_ram_cache_bytes = 1 << 30;
        let dev = CpuDevice::new(tc.gpu_mem_budget);
        let mut trainer = Trainer::new(&dev, &ModelSource::Random { model: model.clone(), seed: 5 }, tc).unwrap();
        trainer.validation_loss(&tokens, 1).unwrap();
        let want = trainer.placement().nvme_traffic.total();
        for step in 0..3 {
            let r = trainer.train_step(&tokens).unwrap();
            if step > 0 {
                let got = (r.nvme_read_bytes, r.nvme_written_bytes);
                assert_eq!(got, (want.read_bytes, want.written_bytes), "{grad_accum} micro-batches, step {step}");
            }
        }
        trainer.finish().unwrap();
    }
}

/// Overlapped, the working copies a step reads after the update's sweep (the evicted blocks' backward
/// uploads, a later micro-batch's forward) are read ahead on their own thread while the block before
/// computes, and the blocks' gradients are written back on another while the next block computes:
/// every steady step reads ahead and writes behind exactly the bytes the plan predicts, and the bits
/// are the sequential run's, which does neither.
#[test]
fn working_copies_read_ahead_and_gradients_written_behind_change_nothing() {
    use zerostream::train::{ModelSource, Trainer};
    let golden = Golden::load(GOLDEN);
    let (model, tokens) = six_block_model();
    let train = |sequential: bool| {
        let nvme = tempfile::tempdir().unwrap();
        let mut tc = TrainConfig { steps: 4, sequential, recompute: true, ..on_nvme(&golden.train_config(), &nvme) };
        tc.gpu_mem_budget = Some(zerostream::train::minimum_device_bytes_on(&model, &tc, AllocCosts::CPU));
        let dev = CpuDevice::new(tc.gpu_mem_budget);
        let mut trainer = Trainer::new(&dev, &ModelSource::Random { model: model.clone(), seed: 5 }, tc).unwrap();
        let reports: Vec<_> = (0..4).map(|_| trainer.train_step(&tokens).unwrap()).collect();
        let placement = trainer.placement().clone();
        let weights = trainer.master_weights().unwrap();
        let bits: Vec<u64> = reports.iter().flat_map(|r| [r.loss.to_bits(), r.grad_norm.to_bits()]).collect();
        (reports, placement, bits, weights)
    };
    let (overlapped, placement, bits, weights) = train(false);
    assert_eq!(placement.block_slots, 2, "four of the six blocks are evicted before their backward");
    let sharding = zerostream::train::Sharding { rank: 0, world: 1, stage: ZeroStage::One };
    let block_bytes = 4 * sharding.group(placement.group_lens[1]).working_len as u64;
    // Both micro-batches' backward re-read blocks 0-3; the second's forward reads blocks 2-5 (0 and 1
    // are still in their slots from the first's backward).
    let want = placement.nvme_traffic.read_ahead_bytes;
    assert_eq!(want, 12 * block_bytes, "{:?}", placement.nvme_traffic);
    // Both micro-batches write every group's gradient behind, the head's too.
    let grad_bytes = |k: usize| 4 * sharding.group(placement.group_lens[k]).slice_len() as u64;
    let behind = placement.nvme_traffic.written_behind_bytes;
    assert_eq!(behind, 2 * (grad_bytes(0) + 6 * grad_bytes(1)), "{:?}", placement.nvme_traffic);
    let printed = placement.nvme_traffic.describe(placement.params);
    assert!(printed.contains("GB read ahead") && printed.contains("GB written behind"), "plan prints them: {printed}");
    for (step, r) in overlapped.iter().enumerate().skip(1) {
        assert_eq!(r.nvme_read_ahead_bytes, want, "step {step}");
        assert_eq!(r.nvme_written_behind_bytes, behind, "step {step}");
    }
    let (sequential, sequential_placement, sequential_bits, sequential_weights) = train(true);
    assert_eq!(sequential_placement.nvme_traffic.read_ahead_bytes, 0);
    assert_eq!(sequential_placement.nvme_traffic.written_behind_bytes, 0);
    assert!(
        sequential.iter().all(|r| r.nvme_read_ahead_bytes == 0 && r.nvme_written_behind_bytes == 0),
        "nothing in the background in sequence"
    );
    assert!(bits == sequential_bits, "reading ahead changed a loss or a norm");
    assert!(weights == sequential_weights, "reading ahead changed the weights");
}

/// Two ranks in stages 2 and 3 write their gradient slices behind after the exchange (an int8 one,
/// whose residuals the device thread pages beside the writes) and read their working copies ahead:
/// every rank's losses and weights are the sequential run's.
#[test]
fn two_ranks_writing_behind_and_reading_ahead_give_the_sequential_bits() {
    let golden = Golden::load(GOLDEN);
    for stage in [ZeroStage::Two, ZeroStage::Three] {
        let runs = |sequential: bool| {
            let dir = tempfile::tempdir().unwrap();
            let base = on_nvme(&golden.train_config(), &dir);
            let tc = TrainConfig { steps: 3, sequential, zero_stage: stage, grad_compression: GradCompression::Int8, ..base };
            in_process(2, |comm: Comm| run_rank(&CpuDevice::new(None), GOLDEN, tc.clone(), comm)).unwrap()
        };
        let (overlapped, sequential) = (runs(false), runs(true));
        for (rank, (o, s)) in overlapped.iter().zip(&sequential).enumerate() {
            assert_eq!(o.losses, s.losses, "stage {} rank {rank}", stage.number());
            assert!(o.final_params == s.final_params, "stage {} rank {rank}: the weights differ", stage.number());
        }
    }
}
