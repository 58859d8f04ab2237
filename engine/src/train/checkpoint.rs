//! What a checkpoint holds and how the trainer writes and reads it, one group at a time.
//!
//! `step-NNNNNNNN/` (see `zerostream_checkpoints::checkpoint` for the crash-safe directory moves):
//! - `config.json` + `model.safetensors`: a Hugging Face model directory in `--save-dtype`;
//! - `optimizer.rank{r}.safetensors`, one per rank: `{group}.master` and the optimizer's moments,
//!   `{group}.adam_m` and `{group}.adam_v` (AdamW, LAMB) or `{group}.momentum` (LARS), in
//!   `--adam-state`'s format (fp32 or bf16), each the rank's slice of the group's padded
//!   flat buffer, and with `--grad-compression` `{group}.grad_residual` (the rank's error feedback for
//!   the other ranks' slices, in rank order; see `grad_exchange.rs`); the metadata holds the world size,
//!   the stage and every group's length, padded length and owned range, so another world size can
//!   re-split the state (stage 0: the replicas hold the same bits, their master weights checked by CRC at every save;
//!   rank 0's file holds the whole once, every rank's file its residual, laid out as its metadata's
//!   `grad_residual_layout` says);
//! - the tokenizer's files when the run knows its tokenizer (`ModelExtras::files`: GPT-2's
//!   vocab.json + merges.txt + tokenizer_config.json + special_tokens_map.json, or a tokenizer.json),
//!   and the source model's generation_config.json;
//! - `trainer_state.json`: counters, loss scaler, data position, every setting, and the manifest
//!   (size and CRC32 of every other file).
//!
//! Only a few groups are ever in host memory at once beyond the trainer's own state: each group is
//! paged in, written (and, for the model file, gathered from the ranks) and paged out in turn.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use zerostream_checkpoints::checkpoint::{CheckpointRoot, FileDigest, STATE_FILE, partial_dir};
use zerostream_checkpoints::safetensors_stream::{StreamWriter, TensorEntry};

use super::config::{AdamState, Flags};
use super::schedule::ScalerState;
use super::{Precision, Trainer};
use crate::device::Backend;
use crate::model::Model;

mod convert;
mod open;
pub use convert::saved_dtype;
pub use open::Checkpoint;

/// `--save-dtype`: the dtype of the saved model's weights (the optimizer state is always fp32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SaveDtype {
    F32,
    Bf16,
    F16,
}

impl SaveDtype {
    /// The value as `--save-dtype` takes it.
    pub fn flag(self) -> &'static str {
        match self {
            SaveDtype::F32 => "f32",
            SaveDtype::Bf16 => "bf16",
            SaveDtype::F16 => "f16",
        }
    }
    /// The working precision's dtype: what the run computed with.
    pub fn of(precision: Precision) -> Self {
        match precision {
            Precision::Fp32 => SaveDtype::F32,
            Precision::Bf16 => SaveDtype::Bf16,
            Precision::Fp16 => SaveDtype::F16,
        }
    }
    fn dtype(self) -> Dtype {
        match self {
            SaveDtype::F32 => Dtype::F32,
            SaveDtype::Bf16 => Dtype::BF16,
            SaveDtype::F16 => Dtype::F16,
        }
    }
    /// The name transformers' `torch_dtype` uses.
    fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
            SaveDtype::F16 => "float16",
        }
    }
}

pub const FORMAT: &str = "zerostream-checkpoint";
pub const FORMAT_VERSION: u32 = 1;
const MODEL_FILE: &str = "model.safetensors";
const CONFIG_FILE: &str = "config.json";

fn optimizer_file(rank: usize) -> String {
    format!("optimizer.rank{rank}.safetensors")
}

/// `trainer_state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: String,
    pub format_version: u32,
    pub zerostream_version: String,
    /// Optimizer steps completed: the next step's index.
    pub step: u64,
    /// AdamW updates applied (loss-scaled steps skipped for overflow do not count).
    pub adam_steps: u64,
    /// The learning rate the next step will use: where the schedule stands.
    pub next_lr: f64,
    pub loss_scaler: ScalerState,
    /// The first global micro-batch of the next step (step x micro-batches per step).
    pub next_micro_batch: u64,
    pub micro_batches_per_step: usize,
    /// The seed every random draw derives from (initialisation, sampling; counter-based, so there is
    /// no generator state beyond it and the counters above).
    pub seed: u64,
    pub world_size: usize,
    pub zero_stage: u8,
    /// The token file trained on and its length, so a resume on other data is caught.
    pub data: String,
    pub data_tokens: usize,
    /// config.json of the model.
    pub model: serde_json::Value,
    /// Every training setting by flag name.
    pub settings: Flags,
    /// Where the run writes and how often (checkpoints, validation, metrics, TensorBoard, `--save`,
    /// the sample), by flag name with paths from the root: a resume takes each not given again
    /// (`run::kept_outputs`). Absent from older checkpoints.
    #[serde(default, skip_serializing_if = "Flags::is_empty")]
    pub outputs: Flags,
    /// Size and CRC32 of every other file of the checkpoint.
    pub files: BTreeMap<String, FileDigest>,
    /// The loss of the last step run (`step - 1`) as its metrics row holds it, so a resume knows its
    /// `--metrics` rows from another run's; absent from older checkpoints, and where it was not finite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_loss: Option<f64>,
}

/// What a checkpoint records about the run beyond the trainer's own state.
pub struct RunRecord {
    pub seed: u64,
    pub data: String,
    pub data_tokens: usize,
    pub settings: Flags,
    /// Where the run writes and how often, by flag name ([`TrainerState::outputs`]).
    pub outputs: Flags,
    pub save_dtype: SaveDtype,
    /// Checkpoints to keep (0 = all).
    pub keep: usize,
    /// What the saved model directories carry besides the weights and the model's own config.
    pub extras: ModelExtras,
}

/// What a saved model directory carries besides its weights and the model's configuration: files
/// (the data's tokenizer, `DataTokenizer::model_files`; the source model's generation_config.json)
/// and config.json keys the source had that describe no weights (its token ids), so transformers
/// generates from the saved model as from the source.
#[derive(Clone, Debug, Default)]
pub struct ModelExtras {
    /// (name, contents); no tokenizer files where the tokenizer is unknown or has none (bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// Keys merged into the saved config.json.
    pub config_keys: serde_json::Map<String, serde_json::Value>,
}

impl ModelExtras {
    /// The config.json keys a saved model keeps from its source: the special tokens' ids.
    pub const CONFIG_KEYS: &'static [&'static str] = &["bos_token_id", "eos_token_id", "pad_token_id"];
    /// The file a saved model keeps from its source beside the tokenizer's.
    pub const GENERATION_CONFIG: &'static str = "generation_config.json";
}

/// Writes `files` (name, contents) into `dir`; returns their digests.
fn write_extra_files(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<Vec<(String, FileDigest)>> {
    files
        .iter()
        .map(|(name, bytes)| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            Ok((name.clone(), FileDigest { bytes: bytes.len() as u64, crc32: crc32fast::hash(bytes) }))
        })
        .collect()
}

/// Writes config.json for `config` saved in `dtype`, with the source's `keys`; returns its digest.
fn write_config(
    dir: &Path,
    model: &Model,
    dtype: SaveDtype,
    keys: &serde_json::Map<String, serde_json::Value>,
) -> Result<(String, FileDigest)> {
    let mut json = model.to_hf_json();
    for (key, value) in keys {
        json[key] = value.clone();
    }
    json["torch_dtype"] = dtype.torch_name().into();
    let text = serde_json::to_string_pretty(&json)?;
    let path = dir.join(CONFIG_FILE);
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    Ok((CONFIG_FILE.into(), FileDigest { bytes: text.len() as u64, crc32: crc32fast::hash(text.as_bytes()) }))
}

impl<D: Backend> Trainer<'_, D> {
    /// Collective: writes into `dir` (which must exist) this rank's optimizer slices (stage 0: rank 0
    /// the whole state, the other ranks their residuals only) and, on rank 0, the model (gathered group by group) in `dtype` and the `extras`; with `optimizer` false
    /// only the model and `extras`. Returns the files rank 0 wrote and the digests of every rank's
    /// optimizer file (rank 0 only).
    fn write_state(&mut self, dir: &Path, dtype: SaveDtype, optimizer: bool, extras: &ModelExtras) -> Result<Vec<(String, FileDigest)>> {
        self.finish()?;
        let (rank, world) = (self.sharding.rank, self.sharding.world);
        let lead = rank == 0;
        // Stage 0's replicas hold the same state bit for bit (checked below): rank 0 writes it once, and
        // every rank writes only its own error-feedback residuals.
        let writes_state = lead || !self.sharding.replicates();
        let mut model = if lead {
            let entries =
                self.layouts.iter().flat_map(|g| g.tensors.iter().map(|t| TensorEntry::new(&t.name, dtype.dtype(), t.shape.clone())));
            let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
            Some(StreamWriter::create(&dir.join(MODEL_FILE), entries.collect(), &meta)?)
        } else {
            None
        };
        let mut opt = if optimizer { Some(self.optimizer_file_writer(dir, writes_state)?) } else { None };
        let nv = self.nvme.clone();
        let nv = nv.as_deref();
        let optimizer_groups = self.optimizer.as_mut().expect("finished");
        for (k, (g, shard)) in self.layouts.iter().zip(self.shards.iter()).enumerate() {
            let og = &mut optimizer_groups[k];
            og.master.page_in(nv)?;
            if let Some(w) = opt.as_mut().filter(|_| writes_state) {
                og.m.page_in(nv)?;
                og.v.page_in(nv)?;
                w.write_tensor(&format!("{}.master", g.name), og.master.data().bytes())?;
                for (kind, moment) in self.train.optimizer.moment_names().iter().zip([&og.m, &og.v]) {
                    w.write_tensor(&format!("{}.{kind}", g.name), moment.data().bytes())?;
                }
                og.m.page_out(nv, false)?;
                og.v.page_out(nv, false)?;
            }
            let mine = og.master.data().as_slice::<f32>();
            if self.sharding.replicates() {
                check_replicas_agree(&self.comm, &g.name, mine)?;
            }
            let whole = super::gather_owned(&self.comm, &self.sharding, mine, shard.padded_len)?;
            if let Some(w) = model.as_mut() {
                for t in &g.tensors {
                    w.write_f32(&t.name, &whole[t.range()])?;
                }
            }
            og.master.page_out(nv, false)?;
        }
        if let Some(w) = opt.as_mut() {
            for (g, r) in self.layouts.iter().zip(self.exchange.residuals.iter_mut()) {
                r.page_in(nv)?;
                w.write_tensor(&format!("{}.grad_residual", g.name), r.data().bytes())?;
                r.page_out(nv, false)?;
            }
        }
        let mut files = Vec::new();
        if let Some(w) = model {
            files.push((MODEL_FILE.to_string(), w.finish()?));
            files.push(write_config(dir, &self.model, dtype, &extras.config_keys)?);
            files.extend(write_extra_files(dir, &extras.files)?);
        }
        if let Some(w) = opt {
            let digest = w.finish()?;
            let sizes = self.comm.gather_scalars(digest.bytes)?;
            let crcs = self.comm.gather_scalars(digest.crc32)?;
            if lead {
                for r in 0..world {
                    files.push((optimizer_file(r), FileDigest { bytes: sizes[r], crc32: crcs[r] }));
                }
            }
        }
        Ok(files)
    }

    /// This rank's optimizer file in `dir`, its tensors declared: with `writes_state`, each group's
    /// master slice and moments; then, with --grad-compression, each group's error-feedback residual.
    fn optimizer_file_writer(&self, dir: &Path, writes_state: bool) -> Result<StreamWriter> {
        let mut entries = Vec::new();
        let moments = match self.train.adam_state {
            AdamState::Fp32 => Dtype::F32,
            AdamState::Bf16 => Dtype::BF16,
        };
        for (g, shard) in self.layouts.iter().zip(self.shards.iter()).filter(|_| writes_state) {
            entries.push(TensorEntry::new(format!("{}.master", g.name), Dtype::F32, vec![shard.slice_len()]));
            for kind in self.train.optimizer.moment_names() {
                entries.push(TensorEntry::new(format!("{}.{kind}", g.name), moments, vec![shard.slice_len()]));
            }
        }
        for (g, r) in self.layouts.iter().zip(&self.exchange.residuals) {
            entries.push(TensorEntry::new(format!("{}.grad_residual", g.name), Dtype::F32, vec![r.len_bytes() / 4]));
        }
        StreamWriter::create(&dir.join(optimizer_file(self.sharding.rank)), entries, &self.layout_metadata())
    }

    /// The flat layout of this rank's optimizer file, as safetensors metadata (at stage 0, the ranks past
    /// the first declare the whole group but hold only residuals: resuming reads rank 0's state).
    fn layout_metadata(&self) -> BTreeMap<String, String> {
        let groups: Vec<_> = self
            .layouts
            .iter()
            .zip(self.shards.iter())
            .map(|(g, s)| serde_json::json!({ "group": g.name, "len": s.len, "padded_len": s.padded_len, "owned": [s.owned.start, s.owned.end] }))
            .collect();
        BTreeMap::from([
            ("format".to_string(), "zerostream-optimizer".to_string()),
            ("world_size".to_string(), self.sharding.world.to_string()),
            ("rank".to_string(), self.sharding.rank.to_string()),
            ("zero_stage".to_string(), self.sharding.stage.number().to_string()),
            ("groups".to_string(), serde_json::Value::from(groups).to_string()),
            (
                "grad_residual_layout".to_string(),
                residual_layout(&self.sharding, self.train.all_reduce_phases.two_at(self.sharding.world)).to_string(),
            ),
        ])
    }

    /// Collective: writes checkpoint `step-{self.step}` under `root_dir`, whose lock rank 0 holds
    /// (`root`: rank 0 passes it, the other ranks None). Returns the checkpoint's directory once it is
    /// committed on every rank. `last_loss`: the loss of the step just run, recorded for
    /// [`TrainerState::last_loss`].
    pub fn save_checkpoint(
        &mut self,
        root_dir: &Path,
        root: Option<&CheckpointRoot>,
        record: &RunRecord,
        last_loss: f64,
    ) -> Result<PathBuf> {
        if root.is_none() && self.sharding.rank == 0 {
            // Nothing would commit the files written: no checkpoint, and a directory left half made.
            let e = format!(
                "saving a checkpoint in {}: rank 0 commits it and needs its root (`CheckpointRoot::open`, held for the run)",
                root_dir.display()
            );
            // The other ranks are on their way into the save's collectives.
            if self.sharding.world > 1 {
                self.comm.abort(&e);
            }
            bail!(e);
        }
        let partial = match root {
            Some(root) => root.begin(self.step)?,
            None => partial_dir(root_dir, self.step),
        };
        let written = self.write_checkpoint(&partial, root_dir, root, record, last_loss);
        if written.is_err() && root.is_some() && partial.exists() {
            // Not left to fill the disk that refused it (the next run's open would remove it too).
            let _ = std::fs::remove_dir_all(&partial);
        }
        written
    }

    /// [`Self::save_checkpoint`] into its `partial` directory, then committed by rank 0.
    fn write_checkpoint(
        &mut self,
        partial: &Path,
        root_dir: &Path,
        root: Option<&CheckpointRoot>,
        record: &RunRecord,
        last_loss: f64,
    ) -> Result<PathBuf> {
        self.comm.barrier()?; // the directory exists for every rank
        let mut files: BTreeMap<String, FileDigest> =
            self.write_state(partial, record.save_dtype, true, &record.extras)?.into_iter().collect();
        let mut target = root_dir.join(zerostream_checkpoints::checkpoint::step_name(self.step));
        if let Some(root) = root {
            check_every_file_is_here(partial, &files)?;
            let mut state = self.trainer_state(record, std::mem::take(&mut files));
            state.last_loss = Some(last_loss).filter(|l| l.is_finite());
            let path = partial.join(STATE_FILE);
            std::fs::write(&path, serde_json::to_string_pretty(&state)?).with_context(|| format!("writing {}", path.display()))?;
            target = root.commit(self.step, partial)?;
            if let Err(e) = root.prune(record.keep) {
                // The new checkpoint is committed: the run is not ended for an old one that would not go.
                eprintln!("warning: --keep-checkpoints {}: {e:#}", record.keep);
            }
        }
        self.comm.barrier()?;
        Ok(target)
    }

    fn trainer_state(&self, record: &RunRecord, files: BTreeMap<String, FileDigest>) -> TrainerState {
        let micro_batches_per_step = self.train.grad_accum * self.sharding.world;
        TrainerState {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            zerostream_version: env!("CARGO_PKG_VERSION").into(),
            step: self.step,
            adam_steps: self.adam_steps,
            next_lr: self.train.lr.at(self.step),
            loss_scaler: self.scaler.state(),
            next_micro_batch: self.step * micro_batches_per_step as u64,
            micro_batches_per_step,
            seed: record.seed,
            world_size: self.sharding.world,
            zero_stage: self.sharding.stage.number(),
            data: record.data.clone(),
            data_tokens: record.data_tokens,
            model: self.model.to_hf_json(),
            settings: record.settings.clone(),
            outputs: record.outputs.clone(),
            files,
            last_loss: None,
        }
    }

    /// Collective: saves the model as a Hugging Face directory `dir` (config.json + model.safetensors in
    /// `dtype`, and the `extras`), written beside it and moved into place whole; an existing model
    /// there is replaced.
    pub fn save_model(&mut self, dir: &Path, dtype: SaveDtype, extras: &ModelExtras) -> Result<()> {
        let partial = save_partial_dir(dir)?;
        if self.sharding.rank == 0 {
            if partial.exists() {
                std::fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
            }
            std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
        }
        self.comm.barrier()?;
        let written = self.write_state(&partial, dtype, false, extras).and_then(|_| match self.sharding.rank {
            0 => zerostream_checkpoints::checkpoint::publish_dir(&partial, dir),
            _ => Ok(()),
        });
        if let Err(e) = written {
            if self.sharding.rank == 0 && partial.exists() {
                // Not left to fill the disk that refused it; an earlier model that a replacement without
                // an atomic exchange had moved aside goes back under `dir`.
                let _ = std::fs::remove_dir_all(&partial);
                let _ = zerostream_checkpoints::checkpoint::restore_replaced(dir);
            }
            return Err(e).with_context(|| format!("--save {}", dir.display()));
        }
        self.comm.barrier()
    }
}

/// Before rank 0 commits a checkpoint: every file its manifest names (each rank's optimizer file
/// included) is in `partial` at its size. Ranks on machines that do not share `--checkpoint-dir`'s
/// filesystem write their files elsewhere; the checkpoint would be committed whole-looking and
/// refused on resume.
fn check_every_file_is_here(partial: &Path, files: &BTreeMap<String, FileDigest>) -> Result<()> {
    for (name, digest) in files {
        let path = partial.join(name);
        match std::fs::metadata(&path) {
            Ok(meta) if meta.len() == digest.bytes => {}
            found => bail!(
                "checkpoint {}: {name} is {}, though its writer wrote {} bytes: under mpirun every rank must write into the \
                 same --checkpoint-dir, on a filesystem the machines share",
                partial.display(),
                found.map_or("missing".into(), |m| format!("{} bytes", m.len())),
                digest.bytes
            ),
        }
    }
    Ok(())
}

impl TrainerState {
    /// The state file is the one file of a checkpoint its manifest cannot cover: its counts are held to
    /// each other and to the directory's name instead, so an edited or damaged step is refused rather
    /// than resumed at the wrong place in the data and the schedule.
    pub(super) fn check_counts(&self, path: &Path, dir: &Path) -> Result<()> {
        let state = self;
        let damaged = "edited or damaged: resume from another checkpoint";
        let named = dir.file_name().and_then(|n| n.to_str()).and_then(zerostream_checkpoints::checkpoint::parse_step_name);
        if let Some(named) = named.filter(|&n| n != state.step) {
            bail!("{}: records step {}, but its directory is step {named}'s; {damaged}", path.display(), state.step);
        }
        if state.adam_steps > state.step {
            bail!("{}: records {} optimizer steps in {} training steps; {damaged}", path.display(), state.adam_steps, state.step);
        }
        let want = state.step.checked_mul(state.micro_batches_per_step as u64);
        if want != Some(state.next_micro_batch) {
            bail!(
                "{}: records next micro-batch {}, but {} steps of {} micro-batches end at {}; {damaged}",
                path.display(),
                state.next_micro_batch,
                state.step,
                state.micro_batches_per_step,
                want.map_or("(too many)".into(), |w| w.to_string())
            );
        }
        Ok(())
    }
}

/// Where `--save DIR` is written before it is moved into place: `.{name}.partial` beside it.
pub fn save_partial_dir(dir: &Path) -> Result<PathBuf> {
    let name = dir.file_name().and_then(|n| n.to_str()).with_context(|| format!("--save {}: needs a directory name", dir.display()))?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok(parent.join(format!(".{name}.partial")))
}

/// How a rank's `{group}.grad_residual` is laid out, recorded in its optimizer file: a resume takes
/// the residuals only from a checkpoint that lays them out as this run does.
pub(super) fn residual_layout(sharding: &super::shard::Sharding, two_phases: bool) -> &'static str {
    match (sharding.replicates(), two_phases) {
        (false, _) => "other ranks' slices",
        (true, false) => "whole group",
        (true, true) => "other ranks' slices, then the own slice's server residual",
    }
}

/// Collective, at stage 0: every rank's master weights of group `name` must be the same bits, as the
/// replicas are built to be (the same decoded sums, in rank order, on every rank). A checkpoint keeps
/// one copy, so a divergence is refused here, by group, rather than saved as rank 0's alone.
fn check_replicas_agree(comm: &crate::comm::Comm, name: &str, master: &[f32]) -> Result<()> {
    let crcs = comm.gather_scalars(crc32fast::hash(bytemuck::cast_slice(master)))?;
    if let Some(r) = crcs.iter().position(|&c| c != crcs[0]) {
        bail!(
            "--zero-stage 0: rank {r}'s master weights of {name} differ from rank 0's (CRC32 {:08x} against {:08x}); the replicas diverged, so no checkpoint was written from them",
            crcs[r],
            crcs[0]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
