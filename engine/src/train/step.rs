//! One optimizer step: the schedule's operations (fetch, embed, forward, head, backward, downloads,
//! update) executed on the rank's device thread, with where the time went.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use zerostream_checkpoints::TokenFile;
use zerostream_offload::square_sums::SquareSums;

use super::pipeline::{self, Op};
use super::trace::{Lane, traced};
use super::worker::{UpdateJob, adam_seconds_total, lock};
use super::{StepReport, Trainer, report};
use crate::device::Backend;
use crate::ops::dropout::DropoutKeys;

/// What one step carries from operation to operation.
pub(super) struct StepState<D: Backend> {
    clock: Clock,
    /// Micro-batches per step over all ranks: the step loss is their mean.
    micro_batches: usize,
    lr: f64,
    loss_scale: f32,
    /// The current micro-batch's (inputs, targets) on the device.
    tokens: Option<(D::Tokens, D::Tokens)>,
    /// The current micro-batch's input ids on the host (the embedding's rows are gathered there).
    input_ids: Vec<u32>,
    /// Gradient downloads begun and not yet finished: (block, read).
    in_flight: VecDeque<(usize, D::PendingRead)>,
    micro: usize,
    /// The current micro-batch's dropout masks' keys (None without dropout).
    dropout: Option<DropoutKeys>,
    /// This rank's micro-batches' losses, in accumulation order.
    losses: Vec<f32>,
    /// The step's losses summed over every rank's micro-batches ([`Trainer::update`]).
    loss_sum: f64,
    overflow: bool,
    grad_norm: f64,
    applied: bool,
}

/// Running totals of where a step's time goes on the device thread.
#[derive(Default)]
pub(super) struct Clock {
    pub(super) compute: Duration,
    pub(super) upload: Duration,
    pub(super) download: Duration,
    /// compute + upload + download when the step's first vocabulary head began.
    pub(super) forward_device: Option<Duration>,
    pub(super) update_wait: Duration,
    pub(super) io_wait: Duration,
    pub(super) upload_bytes: u64,
    pub(super) download_bytes: u64,
}

pub(super) fn timed<R>(total: &mut Duration, f: impl FnOnce() -> R) -> R {
    let t = Instant::now();
    let r = f();
    *total += t.elapsed();
    r
}

impl<D: Backend> Trainer<'_, D> {
    /// One optimizer step over micro-batches `step*M .. step*M+M-1` of `data` (M = accumulation x
    /// ranks; this rank's are those i with i % world = rank): runs [`pipeline::step_schedule`].
    pub fn train_step(&mut self, data: &TokenFile) -> Result<StepReport> {
        self.start_worker()?;
        let start = Instant::now();
        let adam_before = adam_seconds_total(&self.progress);
        let comm_before = self.comm.stats();
        let nvme_before = self.nvme_traffic().unwrap_or_default();
        let background_before = self.background_bytes();
        let mut st = StepState::<D> {
            clock: Clock::default(),
            micro_batches: self.train.grad_accum * self.sharding.world,
            lr: self.train.lr.at(self.step),
            loss_scale: self.scaler.scale,
            tokens: None,
            input_ids: Vec::new(),
            in_flight: VecDeque::new(),
            micro: 0,
            dropout: None,
            losses: Vec::with_capacity(self.train.grad_accum),
            loss_sum: 0.0,
            overflow: false,
            grad_norm: 0.0,
            applied: false,
        };
        let schedule = pipeline::step_schedule(self.model.n_layer(), self.train.grad_accum, !self.train.sequential);
        let trace = self.trace.clone();
        for op in schedule {
            traced(trace.as_deref(), Lane::Device, || op.to_string(), || self.run_op(op, data, &mut st))?;
        }
        let StepState { clock, micro_batches, lr, loss_scale, loss_sum, grad_norm, applied, .. } = st;
        let nvme_after = self.nvme_traffic().unwrap_or_default();
        let background_after = self.background_bytes();
        // The kernels' share by the device's clock: waits for the step's last work (its losses and
        // gradients were waited for already), so the next step's recording starts on an idle queue.
        let kernel_seconds = self.dev.kernel_seconds();
        if let Some(t) = &trace {
            t.span(Lane::Device, &format!("step {}", self.step), start);
        }
        let gpu_kernels_s = kernel_seconds.zip(self.kernel_seconds_seen).map(|(now, before)| now - before);
        self.kernel_seconds_seen = kernel_seconds;
        let report = StepReport {
            step: self.step,
            loss: loss_sum / micro_batches as f64,
            grad_norm,
            lr,
            loss_scale,
            applied,
            tokens: self.train.batch * self.train.seq_len * micro_batches,
            seconds: start.elapsed().as_secs_f64(),
            compute_s: clock.compute.as_secs_f64(),
            gpu_kernels_s,
            upload_s: clock.upload.as_secs_f64(),
            download_s: clock.download.as_secs_f64(),
            forward_device_s: clock.forward_device.unwrap_or_default().as_secs_f64(),
            adam_s: adam_seconds_total(&self.progress) - adam_before,
            update_wait_s: clock.update_wait.as_secs_f64(),
            io_wait_s: clock.io_wait.as_secs_f64(),
            upload_bytes: clock.upload_bytes,
            download_bytes: clock.download_bytes,
            peak_device_bytes: self.dev.alloc_stats().peak_bytes,
            nvme_read_bytes: nvme_after.0 - nvme_before.0,
            nvme_written_bytes: nvme_after.1 - nvme_before.1,
            nvme_read_ahead_bytes: background_after.0 - background_before.0,
            nvme_written_behind_bytes: background_after.1 - background_before.1,
            peak_rss_bytes: report::peak_rss_bytes(),
            comm: self.comm.stats() - comm_before,
            val_loss: None,
            predicted_step_s: None,
        };
        self.step += 1;
        Ok(report)
    }

    /// Executes one operation of the step's schedule.
    fn run_op(&mut self, op: Op, data: &TokenFile, st: &mut StepState<D>) -> Result<()> {
        let (dev, batch, seq_len, recompute) = (self.dev, self.train.batch, self.train.seq_len, self.train.recompute);
        let model = &self.model;
        let d = &self.device;
        let acts = |l: usize| &d.block_acts[if recompute { 0 } else { l }];
        match op {
            Op::FetchHead => self.fetch_head(&mut st.clock)?,
            Op::Embed { micro } => self.embed_micro_batch(micro, data, st)?,
            Op::Fetch { block } => {
                self.ensure_block(block, &mut st.clock)?;
            }
            Op::ReadAhead { block } => self.read_ahead(block)?,
            Op::Forward { block: l } => {
                let slot = self.slot_of(l)?;
                let dropout = st.dropout.as_ref();
                timed(&mut st.clock.compute, || {
                    model.block_forward(dev, l, &d.slots[slot], acts(l), &d.residual[l], &d.residual[l + 1], batch, seq_len, dropout)
                });
            }
            Op::Head => self.head(st)?,
            Op::Backward { block: l } => {
                let slot = self.slot_of(l)?;
                let grads = &d.block_grads[l % 2];
                let dropout = st.dropout.as_ref();
                timed(&mut st.clock.compute, || {
                    if recompute {
                        // The same keys draw the same masks: the recomputed activations are forward's.
                        model.block_forward(dev, l, &d.slots[slot], acts(l), &d.residual[l], &d.residual[l + 1], batch, seq_len, dropout);
                    }
                    grads.iter().for_each(|t| dev.fill(t, 0.0));
                    model.block_backward(dev, l, &d.slots[slot], grads, acts(l), &d.residual[l], &d.head_acts, dropout);
                });
            }
            Op::BeginDownload { block } => {
                let grads: Vec<&D::Tensor> = d.block_grads[block % 2].iter().collect();
                let pending = timed(&mut st.clock.download, || dev.begin_read(&grads));
                st.in_flight.push_back((block, pending));
            }
            Op::FinishDownload { block } => {
                let (done, pending) = st.in_flight.pop_front().expect("a download was begun");
                debug_assert_eq!(done, block, "downloads finish in the order they began");
                let (first, last) = self.first_and_last(st.micro);
                st.overflow |= self.accumulate(1 + done, pending, first, last, &mut st.clock)?;
            }
            Op::EmbedBackward => {
                let ids = std::mem::take(&mut st.input_ids);
                self.embed_backward(&ids, st.dropout.as_ref(), &mut st.clock)?;
                st.input_ids = ids;
            }
            Op::DownloadHead => {
                let (first, last) = self.first_and_last(st.micro);
                st.overflow |= self.download_head(first, last, &mut st.clock)?;
            }
            Op::ReduceStage1 => self.reduce_stage1_grads()?,
            Op::Update => {
                self.settle_background(&mut st.clock)?;
                self.release_held(&mut st.clock)?;
                self.update(st)?;
            }
            Op::AwaitUpdate => {
                // The whole sweep, write-backs included: nothing of this step's is left for the next.
                let adam_steps = self.adam_steps;
                timed(&mut st.clock.update_wait, || self.progress.wait_for_sweep(adam_steps))?;
            }
        }
        Ok(())
    }

    /// Micro-batch `micro` of this rank's share of the step: its tokens uploaded (the head's gradients
    /// zeroed: each micro-batch's is added into the accumulator on its own) and embedded.
    fn embed_micro_batch(&mut self, micro: usize, data: &TokenFile, st: &mut StepState<D>) -> Result<()> {
        let (dev, d) = (self.dev, &self.device);
        // The training contract: micro-batch i of the step goes to rank i % world, accumulation index
        // i / world.
        let (rank, world) = (self.sharding.rank, self.sharding.world);
        let g = self.step as usize * st.micro_batches + micro * world + rank;
        let (x, y) = data.micro_batch(g, self.train.batch, self.train.seq_len)?;
        // The inputs are checked where they are embedded; a target past the vocabulary would fall in
        // no chunk of the loss and count as logit 0, a wrong loss without a word.
        if let Some((i, id)) = y.iter().enumerate().find(|&(_, &id)| id as usize >= self.model.vocab_size()) {
            bail!(
                "target token id {id} (position {i} of micro-batch {g}) is outside the model's vocabulary of {} ids",
                self.model.vocab_size()
            );
        }
        // The previous micro-batch's ids go first: the plan counts one micro-batch's on the device.
        st.tokens = None;
        let (x_dev, y_dev) = (dev.tokens(&x)?, dev.tokens(&y)?);
        d.head_grads.iter().for_each(|t| dev.fill(t, 0.0));
        self.clear_vocab_grads();
        // Masks are keyed by the global micro-batch index, so they do not depend on the world size.
        st.dropout = self.model.dropout_keys(self.train.seed, self.step, g as u64);
        self.embed(&x, &x_dev, st.dropout.as_ref(), &mut st.clock)?;
        st.tokens = Some((x_dev, y_dev));
        st.input_ids = x;
        st.micro = micro;
        Ok(())
    }

    /// The vocabulary head of the current micro-batch: its loss added to the step's, its backward run;
    /// the first head of the step also marks the end of the forward beside the update's sweep.
    fn head(&mut self, st: &mut StepState<D>) -> Result<()> {
        if st.clock.forward_device.is_none() {
            if self.sync_forward {
                timed(&mut st.clock.compute, || self.dev.synchronize());
            }
            let c = &st.clock;
            st.clock.forward_device = Some(c.compute + c.upload + c.download);
        }
        let y = &st.tokens.as_ref().expect("embedded first").1;
        let scale = Some(st.loss_scale / st.micro_batches as f32);
        let loss = self.head_loss(y, scale, &mut st.clock)?;
        st.losses.push(loss);
        Ok(())
    }

    /// The sum in f64 of every rank's micro-batch `losses`, in the micro-batches' global order (micro-batch
    /// j is rank j % N's accumulation index j / N), as one rank adds them: the world size never changes
    /// a bit of it.
    fn loss_sum(&self, losses: &[f32]) -> Result<f64> {
        let world = self.sharding.world;
        let mut all = vec![0f32; losses.len() * world];
        self.comm.all_gather(losses, &mut all, false)?;
        let (all, n) = (&all, losses.len());
        let by_micro_batch = (0..n).flat_map(|i| (0..world).map(move |r| all[r * n + i]));
        Ok(by_micro_batch.fold(0.0, |sum, loss| sum + loss as f64))
    }

    /// Whether micro-batch `micro` gives the step's first and its last contribution to a group's
    /// accumulator.
    fn first_and_last(&self, micro: usize) -> (bool, bool) {
        (micro == 0, micro + 1 == self.train.grad_accum)
    }

    /// The slot that holds block `l` this step (its Fetch comes first in every schedule).
    fn slot_of(&self, l: usize) -> Result<usize> {
        let slot = l % self.device.slots.len();
        if self.device.slot_holds[slot] != Some((l, self.step)) {
            bail!("internal: block {l} computed before it was fetched (schedule bug)");
        }
        Ok(slot)
    }

    /// The end of a step: the loss, the global norm and overflow (loss-scaled runs) agreed across ranks, the loss
    /// scale updated, and AdamW handed to the worker thread (unless the step is skipped).
    fn update(&mut self, st: &mut StepState<D>) -> Result<()> {
        // Global norm over every group's (scaled) gradient: the exact sums of squares of this rank's
        // slices, and (stages 1-3 with several ranks) every rank's, so the world size never changes
        // a bit of it (stage 0: every rank's is the whole's).
        let mut squares = SquareSums::default();
        self.shared.iter().for_each(|s| squares.add(&lock(s).grad_squares));
        if !self.sharding.replicates() {
            squares = self.comm.sum_square_sums(&[squares])?.pop().expect("one sum");
        }
        st.grad_norm = squares.to_f64().sqrt() / st.loss_scale as f64;
        let overflow = self.comm.any(st.overflow || !st.grad_norm.is_finite())?;
        st.loss_sum = self.loss_sum(&st.losses)?;
        st.applied = self.scaler.update(overflow);
        if st.applied {
            // torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6), at most 1, in f32.
            let clip = if self.train.grad_clip > 0.0 { (self.train.grad_clip as f32 / (st.grad_norm as f32 + 1e-6)).min(1.0) } else { 1.0 };
            self.adam_steps += 1;
            // Overlapped, the next step's forward takes the sweep's new working copies as it makes them.
            let keep_fresh = !self.train.sequential;
            let trace = self.trace.clone();
            let job = UpdateJob { lr: st.lr, adam_step: self.adam_steps, grad_multiplier: clip / st.loss_scale, keep_fresh, trace };
            self.jobs.as_ref().expect("the worker is running").send(job).map_err(|_| self.worker_error())?;
        }
        Ok(())
    }
}
