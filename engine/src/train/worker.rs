//! The optimizer thread (AdamW, LAMB or LARS): for each step, a pipelined sweep over the parameter
//! groups in order, while the device thread goes on with the next step and waits for a group only when
//! it is about to upload it.

use std::ops::Range;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Result, bail};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};
use zerostream_offload::layerwise::NormSlots;
use zerostream_offload::square_sums::SquareSums;
use zerostream_offload::{AdamW, Grads, Layerwise, MomentNoise, Moments, NvmeDir, ParamCopy, Stored, Tier, pipelined_sweep};

use crate::comm::Comm;

use super::config::{AdamState, Precision};
use super::layout::GroupLayout;
use super::shard::{GroupShard, intersect};
use super::trace::{Lane, Trace};

/// The part of a group both threads touch: gradients (written by the device thread, read by the
/// update) and the working copy (written by the update, read by the device thread for upload).
pub(super) struct SharedGroup {
    /// This rank's slice of the step's summed gradient (all of it with one rank), f32. It lives with
    /// the optimizer state: in RAM, or on NVMe (paged in to add a micro-batch into it and for the
    /// update), so host RAM does not grow by 4 bytes per parameter when the state is on NVMe.
    pub(super) grads: Stored,
    /// The exact sum of squares of `grads`, taken when the step's last contribution was added: the
    /// global norm sums these over groups and ranks (exactly, so at any world size the same bits)
    /// without paging the gradients in again.
    pub(super) grad_squares: SquareSums,
    /// This rank's working copy: the whole group (its own slice fresh from the update, the others'
    /// gathered by the device thread before upload) or, in stage 3, its slice alone.
    pub(super) working: Stored,
    /// How many updates the whole working copy reflects (stages 1-2 with several ranks: the device
    /// thread gathers the other ranks' slices once per update).
    pub(super) gathered: u64,
    /// The working copy stays paged in from its forward upload to its backward one (a block
    /// `--params-ram-cache` holds: `Placement::cached_working_blocks`): Some(whether a gather
    /// completed it, so its tier's copy is stale until the backward upload writes it back).
    pub(super) held_for_backward: Option<bool>,
    /// The update's new working copy, written to its tier and kept resident for the next upload (the
    /// next forward's), which then reads nothing: counted in [`ProgressState::fresh_waiting`].
    pub(super) fresh: bool,
}

impl SharedGroup {
    /// Changes the step's gradient with `f`: the first contribution of a step overwrites it (it is not
    /// read back from its tier), later ones add into it; after the `last`, its sum of squares is taken
    /// for the norm. Then `after` says whether the gradient is paged out again (written back when on
    /// NVMe) or left resident for the write-behind thread (`background_io.rs`).
    pub(super) fn change_grads(
        &mut self,
        nvme: Option<&NvmeDir>,
        first: bool,
        last: bool,
        after: AfterChange,
        f: impl FnOnce(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        if first {
            self.grads.page_in_zeroed(nvme);
        } else {
            self.grads.page_in(nvme)?;
        }
        let grads = self.grads.data_mut().as_mut_slice::<f32>();
        f(grads)?;
        if last {
            self.grad_squares = SquareSums::of(grads);
        }
        if after == AfterChange::PageOut {
            self.grads.page_out(nvme, true)?;
        }
        Ok(())
    }
}

/// What [`SharedGroup::change_grads`] does with the gradient once changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AfterChange {
    /// Page it out (written back when on NVMe) at once.
    PageOut,
    /// Leave it resident: the write-behind thread writes it back.
    LeaveResident,
}

/// The part only the update touches: this rank's slices.
pub(super) struct OptimizerGroup {
    /// The group's index (0 the head, 1 + l block l).
    pub(super) group: usize,
    pub(super) master: Stored,
    pub(super) m: Stored,
    pub(super) v: Stored,
}

/// The formats the update writes: the working copy's (`--precision`) and the moments'
/// (`--adam-state`), and the seed of the bf16 moments' rounding noise (the run's `--seed`).
#[derive(Clone, Copy, Debug)]
pub(super) struct UpdateFormats {
    pub(super) working: Precision,
    pub(super) moments: AdamState,
    pub(super) noise_seed: u64,
}

/// One update for the worker: everything it needs to know about the step.
pub(super) struct UpdateJob {
    pub(super) lr: f64,
    /// AdamW's step number (from 1; skipped steps do not count, as with PyTorch's GradScaler).
    pub(super) adam_step: u64,
    /// Multiplies every gradient: clip coefficient / loss scale.
    pub(super) grad_multiplier: f32,
    /// Whether the sweep keeps its new working copies (on NVMe) resident for the next step's forward,
    /// at most [`FRESH_COPIES_AHEAD`] groups ahead of it: an overlapped schedule, whose forward takes
    /// them in the sweep's order.
    pub(super) keep_fresh: bool,
    /// `--trace`: each group's update is a span there.
    pub(super) trace: Option<Arc<Trace>>,
}

/// How many groups' fresh working copies the sweep keeps resident ahead of the forward that uploads
/// them: the sweep waits rather than keep more, so the forward reads none of them back from the drive
/// and the RAM they take is bounded (the plan counts them).
pub(crate) const FRESH_COPIES_AHEAD: usize = 2;

/// How far the worker has got: updates applied per group, AdamW seconds per job, the first error.
pub(super) struct Progress {
    pub(super) state: Mutex<ProgressState>,
    pub(super) changed: Condvar,
}

impl Progress {
    /// `groups` groups, every one updated through AdamW step `adam_steps` (0, or a checkpoint's).
    pub(super) fn new(groups: usize, adam_steps: u64) -> Self {
        let state = ProgressState {
            updated: vec![adam_steps; groups],
            swept: adam_steps,
            adam_seconds: Vec::new(),
            failed: None,
            fresh_waiting: 0,
            fresh_stopped_through: 0,
        };
        Progress { state: Mutex::new(state), changed: Condvar::new() }
    }
}

pub(super) struct ProgressState {
    pub(super) updated: Vec<u64>,
    /// The AdamW step of the last sweep finished whole: every group updated and its state written back
    /// to its tier (a group counts as `updated` before its write-back).
    pub(super) swept: u64,
    pub(super) adam_seconds: Vec<f64>,
    pub(super) failed: Option<String>,
    /// Groups holding a fresh working copy not yet uploaded ([`SharedGroup::fresh`]).
    pub(super) fresh_waiting: usize,
    /// The sweeps (by AdamW step) that keep no more fresh copies: stopped by the device thread when it
    /// will not take them in order (it waits for a whole sweep, or for a group while they fill the
    /// window), so the sweep never waits for a forward that is not coming; or by the sweep itself after
    /// [`FRESH_WAIT_LIMIT`].
    pub(super) fresh_stopped_through: u64,
}

impl Progress {
    pub(super) fn lock(&self) -> MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Blocks until group `k` has had `count` updates. Should fresh copies fill the window meanwhile
    /// (uploads out of the sweep's order), that sweep stops keeping them rather than wait for them.
    pub(super) fn wait_for(&self, k: usize, count: u64) -> Result<()> {
        let mut s = self.lock();
        loop {
            if let Some(e) = &s.failed {
                bail!("the optimizer update failed: {e}");
            }
            if s.updated[k] >= count {
                return Ok(());
            }
            if s.fresh_waiting >= FRESH_COPIES_AHEAD && s.fresh_stopped_through < count {
                s.fresh_stopped_through = count;
                self.changed.notify_all();
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Blocks until the sweep of AdamW step `adam_step` has finished, write-backs included (that sweep
    /// keeps no more fresh copies: no forward takes them while this waits).
    pub(super) fn wait_for_sweep(&self, adam_step: u64) -> Result<()> {
        self.stop_fresh(adam_step);
        let mut s = self.lock();
        loop {
            if let Some(e) = &s.failed {
                bail!("the optimizer update failed: {e}");
            }
            if s.swept >= adam_step {
                return Ok(());
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    // The fresh working copies the sweep keeps resident for the next forward's uploads.

    /// The sweeps up to AdamW step `adam_step` keep no more fresh working copies (those kept stay
    /// valid for their upload).
    pub(super) fn stop_fresh(&self, adam_step: u64) {
        let mut s = self.lock();
        s.fresh_stopped_through = s.fresh_stopped_through.max(adam_step);
        drop(s);
        self.changed.notify_all();
    }

    /// A fresh copy was uploaded or let go: room for another.
    pub(super) fn took_fresh(&self) {
        let mut s = self.lock();
        s.fresh_waiting = s.fresh_waiting.checked_sub(1).expect("a fresh copy was counted");
        drop(s);
        self.changed.notify_all();
    }

    /// Group `k` updated (its new working copy kept resident for the forward where `fresh`), counted
    /// while its lock `group` is still held, so whoever takes the copy finds it counted; then the
    /// group is unlocked and the waiters woken.
    fn group_updated(&self, k: usize, fresh: bool, mut group: MutexGuard<'_, SharedGroup>) {
        let mut p = self.lock();
        p.updated[k] += 1;
        if fresh {
            debug_assert!(!group.fresh, "every sweep starts with no fresh copy left (Trainer::release_held)");
            group.fresh = true;
            p.fresh_waiting += 1;
        }
        drop((p, group));
        self.changed.notify_all();
    }

    /// The sweep of `adam_step`, before updating a group: whether it keeps the group's new working
    /// copy resident, waiting (if it `may_wait`) while [`FRESH_COPIES_AHEAD`] are not yet uploaded. No
    /// (and no wait) once the sweep is stopped from keeping them, after a failure, or after
    /// [`FRESH_WAIT_LIMIT`] without room.
    fn room_for_fresh(&self, adam_step: u64, may_wait: bool) -> bool {
        let mut s = self.lock();
        let since = Instant::now();
        loop {
            if s.failed.is_some() || s.fresh_stopped_through >= adam_step {
                return false;
            }
            if s.fresh_waiting < FRESH_COPIES_AHEAD {
                return true;
            }
            if !may_wait {
                return false;
            }
            let Some(left) = FRESH_WAIT_LIMIT.checked_sub(since.elapsed()) else {
                s.fresh_stopped_through = adam_step;
                return false;
            };
            s = self.changed.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// The longest the sweep waits for room to keep a fresh copy (the forward's upload of the oldest
/// one): a safety net, as every path of this rank that does not take them in order stops the sweep
/// first.
const FRESH_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) fn adam_seconds_total(p: &Progress) -> f64 {
    p.lock().adam_seconds.iter().sum()
}

/// Writes the working copy of master weights (fp32: the same values) at element `at` of `working`.
pub(super) fn write_working(precision: Precision, master: &[f32], working: &mut Stored, at: usize) {
    let n = master.len();
    match precision {
        Precision::Fp32 => working.data_mut().as_mut_slice::<f32>()[at..at + n].copy_from_slice(master),
        Precision::Bf16 => {
            for (w, &p) in working.data_mut().as_mut_slice::<u16>()[at..at + n].iter_mut().zip(master) {
                *w = bf16::from_f32(p).to_bits();
            }
        }
        Precision::Fp16 => {
            // By slice: F16C checked once, 8 at a time; the same bits as `f16::from_f32`.
            let words = &mut working.data_mut().as_mut_slice::<u16>()[at..at + n];
            words.reinterpret_cast_mut::<f16>().convert_from_f32_slice(master);
        }
    }
}

/// The rule the update thread applies.
pub(super) enum UpdateRule {
    AdamW(AdamW),
    /// LAMB or LARS, with this rank's channel for summing each tensor's norms over the ranks (split
    /// from the trainer's, so the device thread's collectives never interleave with it).
    Layerwise(Layerwise, Comm),
}

impl UpdateRule {
    fn set_lr(&mut self, lr: f64) {
        match self {
            UpdateRule::AdamW(a) => a.config.lr = lr,
            UpdateRule::Layerwise(l, _) => l.config.lr = lr,
        }
    }
}

/// The working copy's elements `w` as the update's copy target, in the working precision.
fn copy_into(precision: Precision, working: &mut Stored, w: Range<usize>) -> ParamCopy<'_> {
    match precision {
        Precision::Fp32 => ParamCopy::F32(&mut working.data_mut().as_mut_slice::<f32>()[w]),
        Precision::Bf16 => ParamCopy::Bf16(bytemuck::cast_slice_mut(&mut working.data_mut().as_mut_slice::<u16>()[w])),
        Precision::Fp16 => ParamCopy::F16(bytemuck::cast_slice_mut(&mut working.data_mut().as_mut_slice::<u16>()[w])),
    }
}

/// Each of group `k`'s tensors' part inside this rank's slice: the part's group range, its range in
/// the slice (`o`) and in the working copy (`w`), and whether the tensor is decayed; None where the
/// tensor lies outside the slice.
type TensorPart = Option<(Range<usize>, Range<usize>, Range<usize>, bool)>;

fn tensor_parts(layout: &GroupLayout, shard: &GroupShard) -> Vec<TensorPart> {
    let part = |t: &super::layout::TensorSlot| {
        let r = intersect(t.range(), &shard.owned)?;
        let o = r.start - shard.owned.start..r.end - shard.owned.start;
        let w = r.start - shard.working_base..r.end - shard.working_base;
        Some((r, o, w, t.decay))
    };
    layout.tensors.iter().map(part).collect()
}

/// AdamW over group `k`'s slice, tensor by tensor.
fn adamw_group(
    adam: &AdamW,
    k: usize,
    parts: &[TensorPart],
    g: &mut OptimizerGroup,
    sh: &mut SharedGroup,
    job: &UpdateJob,
    formats: UpdateFormats,
) {
    let SharedGroup { grads, working, .. } = sh;
    let grads = grads.data().as_slice::<f32>();
    let p = g.master.data_mut().as_mut_slice::<f32>();
    let (m, v) = (g.m.data_mut(), g.v.data_mut());
    for (r, o, w, decay) in parts.iter().flatten().cloned() {
        let moments = match formats.moments {
            AdamState::Fp32 => Moments::F32 { m: &mut m.as_mut_slice::<f32>()[o.clone()], v: &mut v.as_mut_slice::<f32>()[o.clone()] },
            // The noise follows the element's place in the group (r.start), not in this rank's
            // slice: every world size rounds each element alike.
            AdamState::Bf16 => Moments::Bf16 {
                m: bytemuck::cast_slice_mut(&mut m.as_mut_slice::<u16>()[o.clone()]),
                v: bytemuck::cast_slice_mut(&mut v.as_mut_slice::<u16>()[o.clone()]),
                noise: MomentNoise::new(formats.noise_seed, job.adam_step, k as u64, r.start),
            },
        };
        let copy = copy_into(formats.working, working, w);
        adam.step_moments(&mut p[o.clone()], moments, Grads::F32(&grads[o]), copy, job.adam_step, job.grad_multiplier, decay);
    }
}

/// LAMB or LARS over group `k`'s slice: every tensor part's squared norms (LAMB's moments updated on
/// the way), put together over the ranks in one collective for the whole group (`slots`: in one order
/// of addition at every world size), then each part stepped with its tensor's trust ratio.
#[allow(clippy::too_many_arguments)]
fn layerwise_group(
    opt: &Layerwise,
    comm: &Comm,
    parts: &[TensorPart],
    slots: &NormSlots,
    g: &mut OptimizerGroup,
    sh: &mut SharedGroup,
    job: &UpdateJob,
    working_precision: Precision,
) -> Result<()> {
    let SharedGroup { grads, working, .. } = sh;
    let grads = grads.data().as_slice::<f32>();
    let p = g.master.data_mut().as_mut_slice::<f32>();
    let m = g.m.data_mut().as_mut_slice::<f32>();
    let v = g.v.data_mut().as_mut_slice::<f32>();
    // LARS keeps no v: its slices are empty.
    let v_part = |v: &mut [f32], o: &Range<usize>| if v.is_empty() { 0..0 } else { o.clone() };
    let mut mine = vec![0.0f64; slots.values()];
    for (t, part) in parts.iter().enumerate() {
        let Some((r, o, _, decay)) = part else { continue };
        let vo = v_part(v, o);
        let (step, multiplier) = (job.adam_step, job.grad_multiplier);
        let norms = opt.measure(&p[o.clone()], &mut m[o.clone()], &mut v[vo], &grads[o.clone()], step, multiplier, *decay, r.start);
        slots.fill(t, &norms, &mut mine);
    }
    // One owner per slot: the ranks' vectors add up to the same bits in any order.
    let totals = slots.totals(&comm.sum_f64s(&mine)?);
    for (t, part) in parts.iter().enumerate() {
        let Some((_, o, w, decay)) = part.clone() else { continue };
        let trust = opt.trust_ratio(totals[t], decay);
        let vo = v_part(v, &o);
        let copy = copy_into(working_precision, working, w);
        opt.apply(&mut p[o.clone()], &mut m[o.clone()], &v[vo], &grads[o], copy, job.adam_step, job.grad_multiplier, decay, trust);
    }
    Ok(())
}

/// What the update thread hands back when its jobs end: the optimizer state and the rule.
pub(super) type WorkerState = (Vec<OptimizerGroup>, UpdateRule);

/// The update thread: for each job, a pipelined sweep over the groups in order — the next group's
/// optimizer state is read while this one is updated and the previous one is written back.
#[allow(clippy::too_many_arguments)]
pub(super) fn optimizer_worker(
    jobs: Receiver<UpdateJob>,
    mut optimizer: Vec<OptimizerGroup>,
    mut rule: UpdateRule,
    layouts: &[GroupLayout],
    shards: &[GroupShard],
    shared: &[Mutex<SharedGroup>],
    progress: &Progress,
    nvme: Option<&NvmeDir>,
    formats: UpdateFormats,
) -> Result<WorkerState> {
    let parts: Vec<Vec<TensorPart>> = layouts.iter().zip(shards).map(|(l, s)| tensor_parts(l, s)).collect();
    // Where LAMB's and LARS's norms meet the other ranks' (a slice is the whole group where every rank
    // holds all of it).
    let slots: Vec<NormSlots> = layouts
        .iter()
        .zip(shards)
        .map(|(l, s)| NormSlots::new(&l.tensors.iter().map(|t| t.range()).collect::<Vec<_>>(), s.owned.len()))
        .collect();
    let working_on_nvme = shared.first().is_some_and(|s| lock(s).working.tier() == Tier::Nvme);
    // A sweep that meets the other ranks' (LAMB's and LARS's norms) never waits for room: a rank
    // whose device thread failed waits for its own sweep, which needs this one's, while this rank's
    // device thread waits for that rank in a collective, taking no copies. It keeps what fits.
    let may_wait = match &rule {
        UpdateRule::AdamW(_) => true,
        UpdateRule::Layerwise(_, comm) => comm.world_size() == 1,
    };
    for job in jobs {
        let start = Instant::now();
        rule.set_lr(job.lr);
        let load = |g: &mut OptimizerGroup| -> Result<()> {
            // The step's gradient is read ahead with the state: the device thread writes group k's
            // next gradient only after this update of k is done (it uploads k first, and waits for it),
            // so holding the group's lock for the read delays nobody. One batch: the disk's queue stays
            // full across the four tensors.
            let mut sh = lock(&shared[g.group]);
            Ok(Stored::page_in_all(&mut [&mut sh.grads, &mut g.master, &mut g.m, &mut g.v], nvme)?)
        };
        let store =
            |g: &mut OptimizerGroup| -> Result<()> { Ok(Stored::page_out_all(&mut [&mut g.master, &mut g.m, &mut g.v], nvme, true)?) };
        let compute = |k: usize, g: &mut OptimizerGroup| -> Result<()> {
            let began = Instant::now();
            let keep = job.keep_fresh && working_on_nvme && progress.room_for_fresh(job.adam_step, may_wait);
            let mut sh = lock(&shared[k]);
            sh.working.page_in_zeroed(nvme);
            match &rule {
                UpdateRule::AdamW(adam) => adamw_group(adam, k, &parts[k], g, &mut sh, &job, formats),
                UpdateRule::Layerwise(opt, comm) => layerwise_group(opt, comm, &parts[k], &slots[k], g, &mut sh, &job, formats.working)?,
            }
            if keep {
                sh.working.write_back(nvme)?;
            } else {
                sh.working.page_out(nvme, true)?;
            }
            sh.grads.page_out(nvme, false)?;
            progress.group_updated(k, keep, sh);
            if let Some(trace) = &job.trace {
                trace.span(Lane::Optimizer, &format!("update group {k}"), began);
            }
            Ok(())
        };
        optimizer = match pipelined_sweep(optimizer, load, compute, store) {
            Ok(groups) => groups,
            Err(e) => {
                // The other ranks' optimizer threads may be waiting for this one's norms: stop them.
                if let UpdateRule::Layerwise(_, comm) = &rule {
                    comm.abort(&format!("the optimizer update failed: {e:#}"));
                }
                return Err(e);
            }
        };
        let mut p = progress.lock();
        p.adam_seconds.push(start.elapsed().as_secs_f64());
        p.swept = job.adam_step;
        drop(p);
        progress.changed.notify_all();
    }
    Ok((optimizer, rule))
}
