//! The trainer's host state as it starts: the NVMe directories, and each group's master weights, optimizer
//! moments, working copy and gradient accumulator, on their tiers, filled from a checkpoint (this
//! rank's slices at this world size) or from the model's source (the whole group, one at a time).

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use zerostream_offload::{AlignedBuf, IoEngine, NvmeDir, Stored, Tier};

use super::layout::GroupLayout;
use super::worker::{OptimizerGroup, SharedGroup, write_working};
use super::{GroupShard, ModelSource, Precision, Sharding, TrainConfig};
use crate::comm::compress::ParamCompression;
use crate::device::{Backend, PinRefused};
use crate::model::TensorSpec;

/// The rank's NVMe directories (a `rankN` subdirectory in each `--nvme-dir`, with stable names so a
/// restart finds its files), where any state is on NVMe; the I/O engine's notes go to `io_notes`.
pub(super) fn open_nvme(train: &TrainConfig, sharding: &Sharding, io_notes: &mut Vec<String>) -> Result<Option<Arc<NvmeDir>>> {
    if !train.uses_nvme() {
        return Ok(None);
    }
    if train.nvme_dirs.is_empty() {
        bail!("--offload-optimizer nvme / --offload-params nvme need --nvme-dir DIR");
    }
    let io = IoEngine::new(train.io).context("--io-engine/--block-size/--queue-depth")?;
    let rank_dirs: Vec<std::path::PathBuf> = train.nvme_dirs.iter().map(|d| d.join(format!("rank{}", sharding.rank))).collect();
    let nvme = NvmeDir::striped(&rank_dirs, io, train.verify, sharding.rank)?;
    io_notes.extend(nvme.io.notes.iter().cloned());
    Ok(Some(Arc::new(nvme)))
}

/// Removes the shard files in this rank's NVMe directories that none of its tensors opened (an earlier
/// run's of another model or shape: scratch, never read), said in `notes`; called once every tensor
/// of the run has its file.
pub(super) fn remove_stale_shards(nvme: Option<&NvmeDir>, notes: &mut Vec<String>) -> Result<()> {
    let Some(nvme) = nvme else { return Ok(()) };
    let (files, bytes) = nvme.remove_unopened()?;
    if files > 0 {
        notes.push(format!(
            "removed {} an earlier run of another shape left in the NVMe tier ({}): the tier's files are scratch",
            crate::words::counted(files as u64, "shard file"),
            crate::words::size(bytes)
        ));
    }
    Ok(())
}

/// Where the working copies kept in RAM are made: in the device's pinned host memory
/// (`Backend::alloc_pinned`) while it makes it, with `TrainConfig::pin_memory`. Not for the slices of
/// stage 3 with several ranks, which are gathered into a temporary before every upload and never
/// copied from where they lie.
pub(super) struct Pinning<'d, D: Backend> {
    dev: Option<&'d D>,
    pinned_groups: usize,
    /// The first refusal, and whether it was the adapter's (then nothing more is asked).
    refused: Option<PinRefused>,
}

impl<'d, D: Backend> Pinning<'d, D> {
    pub(super) fn new(dev: &'d D, train: &TrainConfig, sharding: &Sharding) -> Self {
        let dev = (train.pin_memory && !sharding.shards_params()).then_some(dev);
        Pinning { dev, pinned_groups: 0, refused: None }
    }

    /// A pinned buffer of `len_bytes`, or None: not asked for, not offered, or refused (once the
    /// adapter refused, not asked again; a size refused leaves smaller ones to ask for).
    pub(super) fn alloc(&mut self, len_bytes: usize) -> Option<AlignedBuf> {
        if matches!(self.refused, Some(PinRefused::Unavailable(_))) {
            return None;
        }
        match self.dev?.alloc_pinned(len_bytes)? {
            Ok(buf) => {
                self.pinned_groups += 1;
                Some(buf)
            }
            Err(why) => {
                if !matches!(self.refused, Some(PinRefused::Unavailable(_))) {
                    self.refused = Some(why);
                }
                None
            }
        }
    }

    /// What start-up says of it: where the working copies went, and why not all pinned.
    pub(super) fn note(&self) -> Option<String> {
        match &self.refused {
            Some(why) => Some(format!(
                "{} working copies in pinned host memory, the rest uploaded through staging: pinned memory refused ({why})",
                self.pinned_groups
            )),
            None if self.pinned_groups > 0 => {
                Some(format!("{} working copies in pinned host memory: uploaded straight from there", self.pinned_groups))
            }
            None => None,
        }
    }
}

/// Group `k`'s host state on this rank: what the device thread shares with the worker (gradient
/// accumulator, working copy) and what the worker alone holds (master weights, moments). `specs_index`:
/// each tensor's index in checkpoint order. A working copy in RAM goes into the buffer `pinned`
/// makes for its bytes where it makes one (the device's pinned memory: `TrainConfig::pin_memory`).
#[allow(clippy::too_many_arguments)]
pub(super) fn group_state(
    k: usize,
    g: &GroupLayout,
    shard: &GroupShard,
    train: &TrainConfig,
    source: &ModelSource<'_>,
    specs_index: &HashMap<String, usize>,
    nv: Option<&NvmeDir>,
    pinned: &mut dyn FnMut(usize) -> Option<AlignedBuf>,
) -> Result<(SharedGroup, OptimizerGroup)> {
    let slice = shard.slice_len();
    let mut master = Stored::new(&format!("{}.master", g.name), 4 * slice, train.offload_optimizer, nv)?;
    // The optimizer's moments: m and v (AdamW, LAMB), or m alone (LARS's momentum; v empty).
    let moment_names = train.optimizer.moment_names();
    let moment_bytes = |i: usize| if i < moment_names.len() { train.adam_state.moment_bytes() * slice } else { 0 };
    let mut m = Stored::new(&format!("{}.adam_m", g.name), moment_bytes(0), train.offload_optimizer, nv)?;
    let mut v = Stored::new(&format!("{}.adam_v", g.name), moment_bytes(1), train.offload_optimizer, nv)?;
    let bytes = train.precision.working_bytes_per_param();
    let (working_name, working_bytes) = (format!("{}.working", g.name), bytes * shard.working_len);
    let mut working = match train.offload_params {
        Tier::Ram => pinned(working_bytes).map(|buf| Stored::in_ram(&working_name, buf)),
        Tier::Nvme => None,
    }
    .map_or_else(|| Stored::new(&working_name, working_bytes, train.offload_params, nv), Ok)?;
    for s in [&mut master, &mut m, &mut v, &mut working] {
        s.page_in_zeroed(nv);
    }
    let working_range = shard.working_base..shard.working_base + shard.working_len;
    if let ModelSource::Checkpoint(c) = source {
        // This rank's slices at this world size, cut from whichever ranks' files hold them.
        c.read_range(&g.name, "master", shard.owned.clone(), master.data_mut().as_mut_slice())?;
        for (&kind, moment) in moment_names.iter().zip([&mut m, &mut v]) {
            c.read_moment(&g.name, kind, shard.owned.clone(), train.adam_state, moment)?;
        }
        let mut values = vec![0.0f32; shard.working_len];
        c.read_range(&g.name, "master", working_range, &mut values)?;
        write_working(train.precision, &values, &mut working, 0);
    } else {
        // The whole group, one group at a time: every rank keeps only its parts of it.
        let mut whole = vec![0.0f32; shard.padded_len];
        for t in &g.tensors {
            let spec = TensorSpec { name: t.name.clone(), shape: t.shape.clone(), decay: t.decay };
            let values = source.values(specs_index[&t.name], &spec)?;
            whole[t.range()].copy_from_slice(&values);
        }
        master.data_mut().as_mut_slice::<f32>().copy_from_slice(&whole[shard.owned.clone()]);
        // m and v start at zero, as page_in_zeroed leaves them.
        write_working(train.precision, &whole[working_range], &mut working, 0);
    }
    for s in [&mut master, &mut m, &mut v, &mut working] {
        s.page_out(nv, true)?;
    }
    // Gradients live with the optimizer state (written whole by the step's first micro-batch).
    let mut grads = Stored::new(&format!("{}.grad", g.name), 4 * slice, train.gradients_tier(), nv)?;
    grads.page_out(nv, false)?;
    let shared = SharedGroup { grads, grad_squares: Default::default(), working, gathered: 0, held_for_backward: None, fresh: false };
    Ok((shared, OptimizerGroup { group: k, master, m, v }))
}

/// Why `--param-compression` does nothing in this run, if it does not.
/// What `--freeze-variance` does in a run where it is not what it is for: no gradient compressed, or
/// a warm-up as long as the run.
pub(super) fn freeze_variance_note(train: &TrainConfig) -> Option<String> {
    let w = train.grad_compression_warmup;
    if !train.freeze_variance {
        None
    } else if w >= train.steps {
        use crate::words::counted;
        Some(format!(
            "--freeze-variance: the warm-up ({}) lasts the whole run of {}, so nothing freezes",
            counted(w, "step"),
            counted(train.steps, "step")
        ))
    } else if train.grad_compression == crate::comm::compress::GradCompression::None {
        Some(format!("--freeze-variance without --grad-compression: the variance freezes after update {w} all the same"))
    } else {
        None
    }
}

pub(super) fn param_compression_note(train: &TrainConfig, sharding: &Sharding) -> Option<String> {
    if train.param_compression.codec().is_some() && sharding.world == 1 {
        Some(format!("--param-compression {} does nothing with one rank: the working copy is not gathered", train.param_compression.name()))
    } else if train.param_compression.codec().is_some() && sharding.replicates() {
        Some(format!(
            "--param-compression {} does nothing at ZeRO stage 0: every rank updates the whole working copy, which is not gathered",
            train.param_compression.name()
        ))
    } else if train.param_compression == ParamCompression::Bf16 && train.precision == Precision::Bf16 {
        Some("--param-compression bf16 does nothing with --precision bf16: the working copy is bf16 already".into())
    } else {
        None
    }
}
