//! `--resume`: the settings a resumed run trains with. A resumed run continues the recorded run: every
//! setting not given on the command line is the checkpoint's; settings given that would change what
//! the run computes ([`MEANING_FLAGS`]: precision, batch geometry, optimizer and schedule) must equal
//! the checkpoint's and are refused by name otherwise; the rest (steps, world size, tiers, budget,
//! cadence) may change. The micro-batches per step (grad-accum x world size) stay the checkpoint's, so
//! the data order and the step's mean are the same at any world size.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::checkpoint::STATE_FILE;

use super::checkpoint::TrainerState;
use super::config::{MEANING_FLAGS, TrainConfig};

/// Settings that change how a run goes, never its numbers, and have no flag to turn them back on: a
/// resume takes the command line's whether typed or not, rather than the checkpoint's.
const RUN_ONLY_FLAGS: &[&str] = &["no-pin-memory", "copy-queue"];

/// Reads a checkpoint's `trainer_state.json` (without checking its other files: [`super::Checkpoint::open`]
/// does that before any state is used).
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let state: TrainerState =
        serde_json::from_str(&text).with_context(|| format!("{}: not a zerostream trainer state (corrupt?)", path.display()))?;
    state.check_counts(&path, dir)?;
    Ok(state)
}

/// The configuration of a run resuming from `state` (in `dir`) at `world` ranks, given the command
/// line's configuration `cli`, the flags the user typed (`explicit`, by flag name) and `seed`. A
/// configuration whose `--steps` the checkpoint has reached already is returned as it is:
/// [`is_finished`] tells, and the command line ends such a run at once (exit 0).
pub fn merge(
    dir: &Path,
    state: &TrainerState,
    cli: &TrainConfig,
    explicit: &BTreeSet<String>,
    seed: u64,
    world: usize,
) -> Result<TrainConfig> {
    let mut flags = state.settings.clone();
    let given = cli.to_flags();
    // A checkpoint written before a flag existed ran with that flag's default: its settings read back
    // through `from_flags`, which fills the defaults in.
    let recorded_or_default = TrainConfig::from_flags(&state.settings).map(|tc| tc.to_flags()).unwrap_or_default();
    for (name, value) in &given {
        if !explicit.contains(name) {
            continue;
        }
        let recorded = flags.get(name).or_else(|| recorded_or_default.get(name));
        if MEANING_FLAGS.contains(&name.as_str()) && recorded != Some(value) {
            // A run without --dropout trained with its config's own rates, whatever they were.
            let recorded = match (name.as_str(), recorded) {
                ("dropout", Some(serde_json::Value::Null) | None) => {
                    Some(&serde_json::Value::String("(none: the model config's own rates)".into()))
                }
                _ => recorded,
            };
            bail!(
                "--{name} {} differs from the checkpoint's {} ({}): it changes what the run computes, so a resumed run keeps it; \
                 leave --{name} out to use the checkpoint's",
                show(value),
                recorded.map_or("(none)".into(), show),
                dir.display()
            );
        }
        flags.insert(name.clone(), value.clone());
    }
    // How this process runs rather than what it computes: the command line's, typed or not (a
    // `--no-pin-memory` run resumed without the flag pins again; there is no flag to say so).
    for name in RUN_ONLY_FLAGS {
        if let Some(value) = given.get(*name) {
            flags.insert(name.to_string(), value.clone());
        }
    }
    if explicit.contains("seed") && seed != state.seed {
        bail!("--seed {seed} differs from the checkpoint's {} ({}): leave --seed out to use the checkpoint's", state.seed, dir.display());
    }
    let per_step = state.micro_batches_per_step;
    if explicit.contains("grad-accum") {
        if cli.grad_accum * world != per_step {
            bail!(
                "--grad-accum {} x {} = {} micro-batches per step, but the checkpoint's run took {per_step} ({}): \
                 resuming must keep the micro-batches per step (give --grad-accum {}, or leave it out)",
                cli.grad_accum,
                crate::words::counted(world as u64, "rank"),
                cli.grad_accum * world,
                dir.display(),
                if per_step.is_multiple_of(world) { (per_step / world).to_string() } else { "that divides it".into() }
            );
        }
    } else if !per_step.is_multiple_of(world) {
        bail!(
            "the checkpoint's run took {} per step, which {world} ranks cannot share evenly ({}): \
             resume with a world size that divides {per_step}",
            crate::words::counted(per_step as u64, "micro-batch"),
            dir.display()
        );
    } else {
        flags.insert("grad-accum".into(), (per_step / world).into());
    }
    let tc = TrainConfig::from_flags(&flags).with_context(|| format!("the settings recorded in {}", dir.join(STATE_FILE).display()))?;
    Ok(tc)
}

/// Whether a run resumed from `state` with `tc` has nothing left to train (`--steps` counts from the
/// start of training).
pub fn is_finished(state: &TrainerState, tc: &TrainConfig) -> bool {
    tc.steps <= state.step
}

/// What a resume that changes `--steps` does to a cosine schedule, which decays over the whole run:
/// the learning rates from here on are not the ones the first run planned. None where no step still to
/// run changes its rate (a change within the warm-up, which does not depend on the run's length).
pub fn schedule_note(state: &TrainerState, tc: &TrainConfig) -> Option<String> {
    let planned_steps = state.settings.get("steps")?.as_u64()?;
    if planned_steps == tc.steps || tc.lr.schedule != super::LrSchedule::Cosine || is_finished(state, tc) {
        return None;
    }
    // The first step still to run whose rate moves (steps count from 0, as the metrics and the
    // progress lines do).
    let planned = super::LrPlan { total_steps: planned_steps, ..tc.lr };
    // A warm-up rate does not depend on the run's length: a step found is past the warm-up, so the
    // schedule reaches --min-lr at the new run's last step.
    let first = (state.step..tc.steps).find(|&s| tc.lr.at(s) != planned.at(s))?;
    Some(format!(
        "--steps {} (the checkpoint's run planned {planned_steps}): the cosine schedule now reaches --min-lr at step {} instead, \
         so the learning rates from step {first} on differ from the first run's plan (step {first}: {:.4e}, planned {:.4e})",
        tc.steps,
        tc.steps - 1,
        tc.lr.at(first),
        planned.at(first)
    ))
}

fn show(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "(none)".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::schedule::ScalerState;

    fn state(tc: &TrainConfig, world: usize) -> TrainerState {
        TrainerState {
            format: String::new(),
            format_version: 1,
            zerostream_version: String::new(),
            step: 5,
            adam_steps: 5,
            next_lr: 0.0,
            loss_scaler: ScalerState { scale: 1.0, clean_steps: 0, growth_interval: 1 },
            next_micro_batch: 0,
            micro_batches_per_step: tc.grad_accum * world,
            seed: 1,
            world_size: world,
            zero_stage: 2,
            data: String::new(),
            data_tokens: 0,
            model: serde_json::Value::Null,
            settings: tc.to_flags(),
            files: Default::default(),
            outputs: Default::default(),
            last_loss: None,
        }
    }

    #[test]
    fn unset_flags_come_from_the_checkpoint_and_meaning_flags_must_match() {
        let recorded =
            TrainConfig { grad_accum: 2, lr: crate::train::LrPlan { peak: 3e-3, ..TrainConfig::default().lr }, ..TrainConfig::default() };
        let st = state(&recorded, 1);
        let cli = TrainConfig::default();
        let dir = Path::new("ck");
        let none = BTreeSet::new();
        let tc = merge(dir, &st, &cli, &none, 1, 1).unwrap();
        assert_eq!((tc.lr.peak, tc.grad_accum), (3e-3, 2));
        // Two ranks share the two micro-batches.
        assert_eq!(merge(dir, &st, &cli, &none, 1, 2).unwrap().grad_accum, 1);
        let err = merge(dir, &st, &cli, &none, 1, 3).unwrap_err().to_string();
        assert!(err.contains("cannot share evenly"), "{err}");
        let lr = BTreeSet::from(["lr".to_string()]);
        let err = merge(dir, &st, &cli, &lr, 1, 1).unwrap_err().to_string();
        assert!(err.contains("--lr 0.001 differs from the checkpoint's 0.003"), "{err}");
        let accum = BTreeSet::from(["grad-accum".to_string()]);
        let err = merge(dir, &st, &TrainConfig { grad_accum: 1, ..cli.clone() }, &accum, 1, 1).unwrap_err().to_string();
        assert!(err.contains("micro-batches per step"), "{err}");
        let steps = BTreeSet::from(["steps".to_string()]);
        assert_eq!(merge(dir, &st, &TrainConfig { steps: 20, ..cli.clone() }, &steps, 1, 1).unwrap().steps, 20);
        let done = merge(dir, &st, &TrainConfig { steps: 5, ..cli.clone() }, &steps, 1, 1).unwrap();
        assert!(is_finished(&st, &done) && !is_finished(&st, &TrainConfig { steps: st.step + 1, ..done }));
        let seed = BTreeSet::from(["seed".to_string()]);
        assert!(merge(dir, &st, &cli, &seed, 2, 1).unwrap_err().to_string().contains("--seed 2"));
    }

    #[test]
    fn a_new_step_count_under_a_cosine_schedule_is_said_with_the_next_rate() {
        use crate::train::{LrPlan, LrSchedule};
        let lr = LrPlan { peak: 1e-3, min: 1e-4, warmup_steps: 2, total_steps: 10, schedule: LrSchedule::Cosine };
        let recorded = TrainConfig { steps: 10, lr, ..TrainConfig::default() };
        let st = TrainerState { next_lr: lr.at(5), ..state(&recorded, 1) };
        let longer = TrainConfig { steps: 40, lr: LrPlan { total_steps: 40, ..lr }, ..recorded.clone() };
        let note = schedule_note(&st, &longer).expect("a note");
        let (now, planned) = (format!("{:.4e}", longer.lr.at(5)), format!("{:.4e}", lr.at(5)));
        assert_ne!(now, planned);
        assert!(
            note.contains("--steps 40 (the checkpoint's run planned 10)") && note.contains(&format!("step 5: {now}, planned {planned}")),
            "{note}"
        );
        // Resumed inside the warm-up, the rates part where it ends.
        let early = TrainerState { step: 1, ..st.clone() };
        let note = schedule_note(&early, &longer).unwrap();
        let part = format!("from step 3 on differ from the first run's plan (step 3: {:.4e}, planned {:.4e})", longer.lr.at(3), lr.at(3));
        assert!(note.contains(&part), "{note}");
        assert_ne!(format!("{:.4e}", longer.lr.at(3)), format!("{:.4e}", lr.at(3)), "the step named is one whose rate moved");
        assert_eq!(schedule_note(&st, &recorded), None, "the same steps");
        // Both runs inside a warm-up longer than either: the rates to come are the first run's.
        let warm = LrPlan { warmup_steps: 20, total_steps: 4, ..lr };
        let short = TrainConfig { steps: 4, lr: warm, ..recorded.clone() };
        let eight = TrainConfig { steps: 8, lr: LrPlan { total_steps: 8, ..warm }, ..short.clone() };
        assert_eq!(schedule_note(&TrainerState { step: 4, ..state(&short, 1) }, &eight), None);
        let constant = |tc: &TrainConfig| TrainConfig { lr: LrPlan { schedule: LrSchedule::Constant, ..tc.lr }, ..tc.clone() };
        assert_eq!(schedule_note(&state(&constant(&recorded), 1), &constant(&longer)), None, "no decay to move");
    }

    /// `--no-pin-memory` does not carry over: a resume pins unless its own command line says not to.
    #[test]
    fn pinning_is_the_command_lines_not_the_checkpoints() {
        let st = state(&TrainConfig { pin_memory: false, ..TrainConfig::default() }, 1);
        let (dir, none) = (Path::new("ck"), BTreeSet::new());
        assert!(merge(dir, &st, &TrainConfig::default(), &none, 1, 1).unwrap().pin_memory, "resumed without the flag");
        let typed = BTreeSet::from(["no-pin-memory".to_string()]);
        let unpinned = TrainConfig { pin_memory: false, ..TrainConfig::default() };
        assert!(!merge(dir, &st, &unpinned, &typed, 1, 1).unwrap().pin_memory, "resumed with the flag");
        let pinned_before = state(&TrainConfig::default(), 1);
        assert!(!merge(dir, &pinned_before, &unpinned, &typed, 1, 1).unwrap().pin_memory, "the flag added on resume");
    }

    /// A checkpoint from before a meaning flag existed ran with its default: giving the default
    /// explicitly resumes, another value is refused.
    #[test]
    fn a_flag_newer_than_the_checkpoint_counts_as_its_default() {
        let mut st = state(&TrainConfig::default(), 1);
        st.settings.remove("matmul-inputs");
        st.settings.remove("vocab-chunk-rows");
        let (dir, flags) = (Path::new("ck"), BTreeSet::from(["matmul-inputs".to_string(), "vocab-chunk-rows".to_string()]));
        assert!(merge(dir, &st, &TrainConfig::default(), &flags, 1, 1).is_ok());
        let f16 = TrainConfig { matmul_inputs: crate::device::MatmulInputs::F16, ..TrainConfig::default() };
        let err = merge(dir, &st, &f16, &flags, 1, 1).unwrap_err().to_string();
        assert!(err.contains("--matmul-inputs f16 differs from the checkpoint's f32"), "{err}");
        let rows = TrainConfig { vocab_chunk_rows: 100, ..TrainConfig::default() };
        assert!(merge(dir, &st, &rows, &flags, 1, 1).unwrap_err().to_string().contains("--vocab-chunk-rows 100"));
    }
}
