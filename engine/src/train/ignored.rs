//! The flags a run was given that do nothing in it (a validation cadence without validation data, a
//! LARS setting under AdamW): said at start-up, so a typo'd or misunderstood flag is not taken as in
//! effect; and those `plan`, which trains nothing, takes and leaves idle. Refusals stay with the
//! settings that cannot train (`TrainConfig::check`).

use std::collections::BTreeSet;

use super::run::RunOptions;
use super::{LrSchedule, Optimizer, TrainConfig};
use crate::comm::codec::GradCompression;

/// Where a run computes, as far as its idle flags go.
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    /// Ranks in all: one exchanges nothing.
    pub world: usize,
    /// Every rank on the cpu device: nothing is copied to a GPU.
    pub cpu_only: bool,
}

/// One line per flag in `changed` (given at other than its default, by name) that this run, as
/// resolved (a resume's settings merged), leaves without effect: the flag and why.
pub fn ignored_flags(changed: &BTreeSet<String>, train: &TrainConfig, options: &RunOptions, shape: RunShape) -> Vec<String> {
    let no_validation = options.val_data.is_none() && options.data.is_some();
    let optimizer = train.optimizer.name();
    let one_rank = shape.world == 1;
    let exchange = || "one rank exchanges nothing (--world-size, or mpirun's -n)".to_string();
    let no_nvme = !train.uses_nvme();
    let drive = || "no state is on NVMe (--offload-optimizer, --offload-gradients or --offload-params nvme)".to_string();
    let gpu_copies = || "the cpu device copies nothing to a GPU".to_string();
    let compressed = train.grad_compression != GradCompression::None;
    let chunked = matches!(train.grad_compression, GradCompression::Int8 | GradCompression::OneBit);
    let stage0 = train.zero_stage == super::ZeroStage::Zero;
    let rules: [(&str, bool, String); 25] = [
        ("grad-compression", one_rank, exchange()),
        ("grad-compression-chunk", one_rank, exchange()),
        ("param-compression", one_rank, exchange()),
        ("all-reduce-phases", one_rank, exchange()),
        // The warm-up also times --freeze-variance, which applies on one rank too.
        ("grad-compression-warmup", one_rank && !train.freeze_variance, exchange()),
        (
            "grad-compression-warmup",
            !one_rank && !compressed && !train.freeze_variance,
            "nothing is compressed (--grad-compression none) and --freeze-variance is off".into(),
        ),
        ("grad-compression-chunk", !one_rank && !chunked, "only --grad-compression int8 and onebit use chunks".into()),
        ("all-reduce-phases", !one_rank && (!stage0 || !compressed), "it applies to --zero-stage 0 with --grad-compression".into()),
        ("param-compression", !one_rank && stage0, "--zero-stage 0 gathers no working copy".into()),
        ("io-engine", no_nvme, drive()),
        ("block-size", no_nvme, drive()),
        ("queue-depth", no_nvme, drive()),
        ("buffered", no_nvme, drive()),
        ("no-verify", no_nvme, drive()),
        ("no-pin-memory", shape.cpu_only, gpu_copies()),
        ("eval-every", no_validation, "without --val-data there is nothing to validate".into()),
        ("eval-batches", no_validation, "without --val-data there is nothing to validate".into()),
        (
            "save-dtype",
            options.save_dtype.is_some() && options.save.is_none() && options.checkpoints.dir.is_none(),
            "no model is written without --save or --checkpoint-dir".into(),
        ),
        ("prompt", options.sample_tokens == 0, "--sample-tokens 0 generates no sample".into()),
        ("momentum", train.optimizer != Optimizer::Lars, format!("it is LARS's; --optimizer {optimizer} has none")),
        ("trust-coefficient", train.optimizer != Optimizer::Lars, format!("it is LARS's; --optimizer {optimizer} has none")),
        ("beta1", train.optimizer == Optimizer::Lars, "it is AdamW's and LAMB's; --optimizer lars has none".into()),
        ("beta2", train.optimizer == Optimizer::Lars, "it is AdamW's and LAMB's; --optimizer lars has none".into()),
        ("min-lr", train.lr.schedule == LrSchedule::Constant, "--lr-schedule constant never decays to it".into()),
        ("nvme-dir", !train.nvme_dirs.is_empty() && no_nvme, drive()),
    ];
    rules
        .into_iter()
        .filter(|(flag, idle, _)| *idle && changed.contains(*flag))
        .map(|(flag, _, why)| format!("--{flag} does nothing here: {why}"))
        .collect()
}

/// The train flags `plan` takes with the rest of a command line and leaves idle, since it trains
/// nothing and writes no files.
const TRAIN_ONLY: [&str; 8] =
    ["save", "save-dtype", "metrics", "trace", "tensorboard", "checkpoint-dir", "checkpoint-every", "keep-checkpoints"];

/// `plan`'s one line naming the flags in `changed` it leaves idle; None when it was given none.
pub fn ignored_by_plan(changed: &BTreeSet<String>) -> Option<String> {
    let ignored: Vec<String> = TRAIN_ONLY.iter().filter(|f| changed.contains(**f)).map(|f| format!("--{f}")).collect();
    (!ignored.is_empty()).then(|| format!("plan trains nothing and writes no files: {} ignored", ignored.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::run::ModelChoice;

    const ONE_GPU: RunShape = RunShape { world: 1, cpu_only: false };

    #[test]
    fn idle_flags_are_named_only_when_given_and_idle() {
        let options = RunOptions { data: Some("book.bin".into()), ..RunOptions::new(ModelChoice::Demo) };
        let train = TrainConfig::default();
        let given = |flags: &[&str]| flags.iter().map(|f| f.to_string()).collect::<BTreeSet<_>>();
        let said = ignored_flags(&given(&["eval-every", "momentum", "beta1", "lr"]), &train, &options, ONE_GPU);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[0].starts_with("--eval-every does nothing here") && said[1].contains("--optimizer adamw has none"), "{said:?}");
        // With validation data and LARS, those two are in effect and beta1 is not.
        let options = RunOptions { val_data: Some("book.val.bin".into()), ..options };
        let lars = TrainConfig { optimizer: Optimizer::Lars, ..train.clone() };
        let said = ignored_flags(&given(&["eval-every", "momentum", "beta1"]), &lars, &options, ONE_GPU);
        assert_eq!(said, ["--beta1 does nothing here: it is AdamW's and LAMB's; --optimizer lars has none"]);
        // What one rank, no NVMe tier and the cpu device leave idle, and what two ranks on a GPU use.
        let flags = given(&["grad-compression", "io-engine", "no-pin-memory"]);
        let said = ignored_flags(&flags, &train, &options, RunShape { world: 1, cpu_only: true });
        assert_eq!(said.len(), 3, "{said:?}");
        assert!(said[0].contains("one rank exchanges nothing") && said[1].contains("no state is on NVMe"), "{said:?}");
        assert!(said[2].starts_with("--no-pin-memory does nothing here: the cpu device"), "{said:?}");
        let nvme = TrainConfig { offload_optimizer: zerostream_offload::Tier::Nvme, ..TrainConfig::default() };
        assert!(ignored_flags(&flags, &nvme, &options, RunShape { world: 2, cpu_only: false }).is_empty());
        // The warm-up times --freeze-variance on one rank too; on two, it needs compression or the freeze.
        let warmup = given(&["grad-compression-warmup"]);
        let freeze = TrainConfig { freeze_variance: true, ..TrainConfig::default() };
        assert!(ignored_flags(&warmup, &freeze, &options, ONE_GPU).is_empty());
        let said = ignored_flags(&warmup, &train, &options, RunShape { world: 2, cpu_only: false });
        assert!(said.len() == 1 && said[0].contains("nothing is compressed"), "{said:?}");
    }
}
