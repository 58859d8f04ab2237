//! The streaming ZeRO-Offload trainer.
//!
//! Host side, per parameter group (the head, then each block; see [`layout`]): fp32 master weights and
//! Adam moments on the optimizer tier, the working copy the device computes with (f32, or 16-bit per
//! `--precision`) on the parameter tier, and an f32 gradient accumulator on the gradients' tier
//! (`--offload-gradients`, else the optimizer's: on NVMe with the optimizer state there).
//!
//! Device side, under the byte budget: the head's tensors but its vocabulary matrices, and their
//! gradients; the output projection resident whole when the plan says so, else one vocabulary chunk's
//! slot it is streamed through (see `vocab_head.rs`: the embedding's rows are gathered on the host, or
//! on the device from a resident tied projection, and the vocabulary matrices' gradients are made on
//! the host for each micro-batch, downloaded a chunk at a time); the residual stream, the
//! activations (every block's, or one block's with `--recompute`), a few block parameter slots that
//! blocks are uploaded into just before use, and two block gradient buffers. The next block's upload is
//! issued while the current block computes; after each block's backward its gradients are downloaded
//! and added into the host accumulator while the next block's backward computes into the other buffer.
//!
//! The update runs on a worker thread: once a step's gradient norm is known, the worker updates the
//! groups in order (head, block 0, block 1, ...) while the device thread starts the next step, which
//! waits for a group only when it is about to upload it. Each group's update is the same function of
//! the same inputs whichever thread runs when, so the result is bit-identical to running in sequence.

mod background_io;
pub mod checkpoint;
mod choices;
mod config;
pub mod demo;
mod device_state;
mod grad_exchange;
mod host_init;
pub mod ignored;
pub mod launch;
pub mod layout;
pub mod metrics_file;
pub mod outputs;
pub mod pipeline;
mod plan;
pub mod predict;
pub mod ranks;
mod report;
pub mod resume;
pub mod run;
pub mod save_dir;
pub mod schedule;
pub mod shard;
mod step;
pub mod summary;
pub mod tensorboard;
pub mod trace;
pub mod traffic;
mod transfer;
mod validate;
mod vocab_head;
mod worker;

use std::cell::RefCell;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow, bail};
use background_io::{BackgroundIo, Job};
use zerostream_offload::{AdamConfig, AdamW, Layerwise, LayerwiseConfig, NvmeDir, Rule, Tier};

use crate::comm::Comm;
use crate::device::Backend;
pub use crate::device::alloc::available_ram_bytes;
use crate::model::{Model, TensorSpec};
pub use checkpoint::{Checkpoint, RunRecord, SaveDtype};
pub use config::{AdamState, Flags, MEANING_FLAGS, Optimizer, Precision, TrainConfig};
use device_state::DeviceState;
use layout::{GroupLayout, group_layouts};
pub use plan::refuse_past_available_ram;
pub use plan::{Placement, minimum_device_bytes, minimum_device_bytes_on, plan, plan_on};
pub use report::StepReport;
pub use schedule::{LossScaler, LrPlan, LrSchedule};
pub use shard::{GroupShard, Sharding, ZeroStage};
use step::{Clock, timed};
use worker::{
    OptimizerGroup, Progress, SharedGroup, UpdateFormats, UpdateJob, UpdateRule, WorkerState, adam_seconds_total, lock, optimizer_worker,
};

/// Where the model's initial weights come from.
pub enum ModelSource<'a> {
    Hf(&'a zerostream_checkpoints::HfModel),
    /// The family's random initialisation, seeded.
    Random {
        model: Model,
        seed: u64,
    },
    /// A checkpoint being resumed: fp32 master weights, Adam moments and counters.
    Checkpoint(&'a Checkpoint),
}

impl ModelSource<'_> {
    /// The model as `train` runs it: the source's, every dropout probability `--dropout`'s where
    /// given.
    pub fn trained_model(&self, train: &TrainConfig) -> Result<Model> {
        let model = match self {
            ModelSource::Hf(m) => Model::of_hf(m)?,
            ModelSource::Random { model, .. } => model.clone(),
            ModelSource::Checkpoint(c) => c.model.clone(),
        };
        match train.dropout {
            Some(p) => model.with_dropout(p),
            None => Ok(model),
        }
    }

    /// Tensor `spec`'s initial values (number `index` in checkpoint order).
    fn values(&self, index: usize, spec: &TensorSpec) -> Result<Vec<f32>> {
        match self {
            ModelSource::Hf(m) => m.tensor(&spec.name, &spec.shape),
            ModelSource::Random { model, seed } => Ok(model.init(spec, index, *seed)),
            ModelSource::Checkpoint(c) => bail!("internal: {} is read group by group, not tensor {} at a time", c.dir.display(), spec.name),
        }
    }
}

/// The refusals before any work is done: the model and batch settings, the attention shape on this
/// device, and a gpu adapter without the f16 cooperative matrices (naming itself) or without a copy
/// queue for `--copy-queue`; each device setting is applied as it is checked.
fn check_before_work<D: Backend>(dev: &D, model: &Model, train: &TrainConfig) -> Result<()> {
    model.validate()?;
    // Here, not only in `launch`: a library caller's configuration reaches the trainer directly.
    train.check()?;
    model.check_seq_len(train.seq_len)?;
    dev.check_attention(model.attention_dims(train.batch, train.seq_len))?;
    dev.set_matmul_inputs(train.matmul_inputs)?;
    dev.set_copy_queue(train.copy_queue)
}

/// A training run in progress.
pub struct Trainer<'d, D: Backend> {
    dev: &'d D,
    // The run's own: read through the accessors below outside `train` (a caller changing them under a
    // running trainer would leave its state, slots and schedule describing another run).
    pub(crate) model: Model,
    pub(crate) train: TrainConfig,
    pub(crate) placement: Placement,
    layouts: Arc<Vec<GroupLayout>>,
    /// This rank's slice of each group.
    shards: Arc<Vec<GroupShard>>,
    sharding: Sharding,
    comm: Comm,
    shared: Arc<Vec<Mutex<SharedGroup>>>,
    /// Stage 1 with several ranks: each group's whole gradient (the head's too), summed over this
    /// rank's micro-batches and reduce-scattered once at the end of the step (empty otherwise).
    stage1_grads: Vec<Vec<f32>>,
    /// A group's whole downloaded gradient, laid out for the exchange, and (compressed) this rank's
    /// reduced slice of it, reused between calls.
    reduce_scratch: (Vec<f32>, Vec<f32>),
    /// `--param-compression`: a working-copy slice as f32, to encode and decode, reused between gathers.
    gather_values: RefCell<Vec<f32>>,
    /// How gradients cross between ranks, with the error-feedback residuals of a compressed exchange.
    exchange: grad_exchange::GradExchange,
    progress: Arc<Progress>,
    nvme: Option<Arc<NvmeDir>>,
    /// Reads the next block's working copy from NVMe while a block computes (an overlapped schedule
    /// with the working copy on NVMe; None otherwise).
    read_ahead: Option<BackgroundIo>,
    /// Writes each group's gradient back to NVMe while the next block computes (an overlapped
    /// schedule with the gradient accumulator on NVMe; None otherwise).
    write_behind: Option<BackgroundIo>,
    jobs: Option<Sender<UpdateJob>>,
    worker: Option<JoinHandle<Result<WorkerState>>>,
    optimizer: Option<Vec<OptimizerGroup>>,
    /// The update rule, held here while no worker runs (the worker hands it back when it stops).
    rule: Option<UpdateRule>,
    device: DeviceState<D>,
    /// The head group's vocabulary matrices on the host during a step (their words, their gradients).
    vocab: vocab_head::VocabHost,
    pub(crate) scaler: LossScaler,
    /// Optimizer steps done (the next step's index).
    pub(crate) step: u64,
    /// AdamW steps taken (skipped fp16 steps excluded): each is one update job that the worker applies
    /// to every group, so group k is current once it has had this many.
    adam_steps: u64,
    pub io_notes: Vec<String>,
    /// The device's kernel seconds (GPU timestamps) when the last step ended, for the next one's share.
    kernel_seconds_seen: Option<f64>,
    /// Wait for the device before `forward_device_s` is taken, so an asynchronous device's forward is
    /// counted there and not in the head's first wait (`plan --measure`'s cuts; a run does not stall).
    pub(super) sync_forward: bool,
    /// `--trace`: where this rank's step operations and updates are timed (rank 0's only).
    trace: Option<Arc<trace::Trace>>,
}

impl<'d, D: Backend> Trainer<'d, D> {
    /// The model trained.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The run's settings.
    pub fn train(&self) -> &TrainConfig {
        &self.train
    }

    /// Where the state lives and what the device holds.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The loss scaler (fp16 and f16 matmul inputs; a fixed scale of 1 otherwise).
    pub fn scaler(&self) -> &LossScaler {
        &self.scaler
    }

    /// Optimizer steps done: the next step's index.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// A single-rank run: host state (on its tiers) and device state (under the budget) for `source`'s
    /// weights.
    pub fn new(dev: &'d D, source: &ModelSource<'_>, train: TrainConfig) -> Result<Self> {
        Self::with_comm(dev, source, train, Comm::single())
    }

    /// This rank's part of a run of `comm.world_size()` ranks: every rank calls this with the same
    /// model and configuration (checked), then calls the same methods in the same order.
    pub fn with_comm(dev: &'d D, source: &ModelSource<'_>, train: TrainConfig, comm: Comm) -> Result<Self> {
        let model = source.trained_model(&train)?;
        check_before_work(dev, &model, &train)?;
        let sharding = Sharding { rank: comm.rank(), world: comm.world_size(), stage: train.zero_stage };
        check_same_configuration(&comm, &model, &train)?;
        let placement = plan::plan_for_rank(&model, &train, &comm, dev.alloc_costs())?;
        let layouts = Arc::new(group_layouts(&model));
        let shards: Arc<Vec<GroupShard>> = Arc::new(layouts.iter().map(|g| sharding.group(g.len)).collect());

        let mut io_notes = Vec::new();
        let nvme = host_init::open_nvme(&train, &sharding, &mut io_notes)?;
        let nv = nvme.as_deref();

        // Host state, filled group by group from the source.
        let specs_index = checkpoint_order(&model);
        let (mut shared, mut optimizer, mut stage1_grads) = (Vec::new(), Vec::new(), Vec::new());
        let mut pinned = host_init::Pinning::new(dev, &train, &sharding);
        for (k, (g, shard)) in layouts.iter().zip(shards.iter()).enumerate() {
            let (group, state) = host_init::group_state(k, g, shard, &train, source, &specs_index, nv, &mut |n| pinned.alloc(n))?;
            shared.push(Mutex::new(group));
            optimizer.push(state);
            stage1_grads.push(if !sharding.shards_grads() { vec![0.0; shard.padded_len] } else { Vec::new() });
        }

        io_notes.extend(pinned.note());
        let rule = update_rule(&train, &comm, sharding.replicates())?;
        io_notes.extend(host_init::param_compression_note(&train, &sharding));
        io_notes.extend(host_init::freeze_variance_note(&train));
        let names: Vec<&str> = layouts.iter().map(|g| g.name.as_str()).collect();
        let exchange = grad_exchange::GradExchange::new(&train, &sharding, &shards, &names, source, nv, &mut io_notes)?;
        host_init::remove_stale_shards(nv, &mut io_notes)?;
        let device = Self::allocate_device(dev, &model, &train, &placement)?;
        let (step, adam_steps, scaler) = resumed_counters(source, &train, &mut shared, &mut io_notes);
        let progress = Arc::new(Progress::new(layouts.len(), adam_steps));
        let shared = Arc::new(shared);
        // Overlapped, the device thread's own NVMe reads and writes move to threads of their own.
        let background = |job: Job, tier: Tier| match &nvme {
            Some(nvme) if tier == Tier::Nvme && !train.sequential => BackgroundIo::start(job, shared.clone(), nvme.clone()).map(Some),
            _ => Ok(None),
        };
        let read_ahead = background(Job::ReadWorking, train.offload_params)?;
        let write_behind = background(Job::WriteGrads, train.gradients_tier())?;
        Ok(Trainer {
            dev,
            model,
            train,
            placement,
            layouts,
            shards,
            sharding,
            comm,
            shared,
            stage1_grads,
            reduce_scratch: (Vec::new(), Vec::new()),
            gather_values: RefCell::default(),
            exchange,
            progress,
            nvme,
            read_ahead,
            write_behind,
            jobs: None,
            worker: None,
            optimizer: Some(optimizer),
            rule: Some(rule),
            device,
            vocab: vocab_head::VocabHost::default(),
            scaler,
            step,
            adam_steps,
            io_notes,
            kernel_seconds_seen: dev.kernel_seconds(),
            sync_forward: false,
            trace: None,
        })
    }

    /// Times this rank's step operations and optimizer updates into `trace` from the next step on
    /// (None: no longer).
    pub fn set_trace(&mut self, trace: Option<Arc<trace::Trace>>) {
        self.trace = trace;
    }

    fn start_worker(&mut self) -> Result<()> {
        if self.worker.is_some() {
            return Ok(());
        }
        let lost = || anyhow!("the optimizer state was lost after an earlier failure");
        let optimizer = self.optimizer.take().ok_or_else(lost)?;
        let rule = self.rule.take().ok_or_else(lost)?;
        let (tx, rx) = channel();
        let (layouts, shards, shared, progress, nvme) =
            (self.layouts.clone(), self.shards.clone(), self.shared.clone(), self.progress.clone(), self.nvme.clone());
        let formats = UpdateFormats { working: self.train.precision, moments: self.train.adam_state, noise_seed: self.train.seed };
        let handle = std::thread::Builder::new()
            .name("optimizer".into())
            .spawn(move || {
                let result = optimizer_worker(rx, optimizer, rule, &layouts, &shards, &shared, &progress, nvme.as_deref(), formats);
                if let Err(e) = &result {
                    progress.lock().failed = Some(format!("{e:#}"));
                    progress.changed.notify_all();
                }
                result
            })
            .context("spawning the optimizer thread")?;
        self.jobs = Some(tx);
        self.worker = Some(handle);
        Ok(())
    }

    /// Waits for group `k`'s latest update, then makes sure its working copy is resident for upload.
    fn wait_group(&self, k: usize, clock: &mut Clock) -> Result<()> {
        timed(&mut clock.update_wait, || self.progress.wait_for(k, self.adam_steps))
    }

    /// Collective: whether any rank says `flag` (a stop asked for on one rank stops them all at the same step).
    pub fn agree_any(&self, flag: bool) -> Result<bool> {
        self.comm.any(flag)
    }

    fn worker_error(&self) -> anyhow::Error {
        anyhow!("the optimizer update failed: {}", self.progress.lock().failed.clone().unwrap_or_else(|| "its thread stopped".into()))
    }

    /// (bytes read, bytes written) through this rank's NVMe tier so far; None when nothing lives there.
    pub fn nvme_traffic(&self) -> Option<(u64, u64)> {
        self.nvme.as_ref().map(|n| n.traffic())
    }

    /// Of the NVMe bytes moved so far, (the working copies read ahead of their upload, the gradients
    /// written behind the next block's backward).
    fn background_bytes(&self) -> (u64, u64) {
        let moved = |io: &Option<BackgroundIo>| io.as_ref().map_or(0, BackgroundIo::moved_bytes);
        (moved(&self.read_ahead), moved(&self.write_behind))
    }

    /// Waits for the reads and writes in flight on the background threads (before the update, which
    /// reads the gradients the writes write).
    fn settle_background(&self, clock: &mut Clock) -> Result<()> {
        for io in [&self.read_ahead, &self.write_behind].into_iter().flatten() {
            timed(&mut clock.io_wait, || io.settle(None))?;
        }
        Ok(())
    }

    /// The AdamW seconds the optimizer thread has spent since the trainer opened, over every update:
    /// a step's report holds those spent while it ran, so a run's total is the difference of two
    /// readings (the last update finishes after the last report, during the final validation or
    /// [`Self::finish`]).
    pub fn adam_seconds(&self) -> f64 {
        adam_seconds_total(&self.progress)
    }

    /// Waits for the last update and stops the worker.
    pub fn finish(&mut self) -> Result<()> {
        // No forward follows: the last sweep must not wait to keep copies for one.
        self.progress.stop_fresh(self.adam_steps);
        self.jobs = None; // closing the channel ends the worker's loop
        if let Some(handle) = self.worker.take() {
            let (optimizer, rule) = handle.join().map_err(|_| anyhow!("the optimizer thread panicked"))??;
            self.optimizer = Some(optimizer);
            self.rule = Some(rule);
        }
        Ok(())
    }

    /// Group g's fp32 master weights in table order (g as in the layout: 0 the head, 1 + l block l),
    /// after [`Self::finish`]: the group is paged in, gathered from the ranks and paged out again, so one
    /// group at a time is assembled in RAM. With several ranks this is a collective: every rank calls it
    /// for the same groups in the same order.
    pub fn master_group(&mut self, g: usize) -> Result<Vec<Vec<f32>>> {
        self.finish()?;
        let nv = self.nvme.clone();
        let optimizer = self.optimizer.as_mut().expect("finished");
        let Some(((layout, shard), opt)) = self.layouts.get(g).zip(self.shards.get(g)).zip(optimizer.get_mut(g)) else {
            bail!("no parameter group {g}: the model has {}", self.layouts.len());
        };
        opt.master.page_in(nv.as_deref())?;
        let tensors = gather_owned(&self.comm, &self.sharding, opt.master.data().as_slice::<f32>(), shard.padded_len)
            .map(|whole| layout.tensors.iter().map(|t| whole[t.range()].to_vec()).collect());
        opt.master.page_out(nv.as_deref(), false)?;
        tensors
    }

    /// The fp32 master weights, tensor by tensor (name, shape, values), in checkpoint order, after
    /// [`Self::finish`]: the whole model in RAM (the tests' comparisons; the sample and checkpoints go
    /// group by group with [`Self::master_group`]). A collective, as that is.
    pub fn master_weights(&mut self) -> Result<Vec<NamedTensor>> {
        let mut out = Vec::new();
        for g in 0..self.layouts.len() {
            let values = self.master_group(g)?;
            for (t, v) in self.layouts[g].tensors.iter().zip(values) {
                out.push((t.name.clone(), t.shape.clone(), v));
            }
        }
        // Checkpoint order, as Hugging Face writes it.
        let order = checkpoint_order(&self.model);
        out.sort_by_key(|(name, _, _)| order[name]);
        Ok(out)
    }
}

impl<D: Backend> Drop for Trainer<'_, D> {
    fn drop(&mut self) {
        self.progress.stop_fresh(u64::MAX);
        self.jobs = None;
        if let Some(handle) = self.worker.take() {
            let _ = handle.join();
        }
    }
}

/// A group's whole fp32 state (`padded_len` values) from every rank's owned slice, `mine` this rank's:
/// gathered, or `mine` itself where it is the whole (one rank; stage 0). A collective with several
/// ranks at stages 1-3.
fn gather_owned<'a>(comm: &Comm, sharding: &Sharding, mine: &'a [f32], padded_len: usize) -> Result<std::borrow::Cow<'a, [f32]>> {
    if sharding.world == 1 || sharding.replicates() {
        return Ok(std::borrow::Cow::Borrowed(mine));
    }
    let mut whole = vec![0.0f32; padded_len];
    comm.all_gather(mine, &mut whole, false)?;
    Ok(std::borrow::Cow::Owned(whole))
}

/// The update rule `train` asks for. A layer-wise one gets its own channel over the ranks, split from
/// `comm` here, at the same point on every rank.
/// The step, the AdamW step and the loss scaler a run starts from: a fresh run's, or a resumed one's
/// from its checkpoint (whose working copy is whole and current).
fn resumed_counters(
    source: &ModelSource<'_>,
    train: &TrainConfig,
    shared: &mut [Mutex<SharedGroup>],
    notes: &mut Vec<String>,
) -> (u64, u64, LossScaler) {
    let fresh = if train.loss_scaled() { LossScaler::new() } else { LossScaler::fixed_one() };
    // With --param-compression every rank computes with the decoded copy, the first step's too (stage
    // 3 gathers before every upload; stages 1-2 would start from the exact one): gather before the
    // first upload (u64::MAX: no update gathered), after a resume too, as the uninterrupted run did.
    let gather_first = train.param_compression.codec().is_some();
    let ModelSource::Checkpoint(c) = source else {
        if gather_first {
            shared.iter_mut().for_each(|s| lock(s).gathered = u64::MAX);
        }
        return (0, 0, fresh);
    };
    let restored = LossScaler::restore(&c.state.loss_scaler);
    let scaler = if train.loss_scaled() && restored.is_fixed() {
        // A checkpoint of `--matmul-inputs f16` from before that flag scaled the loss.
        notes.push(format!("the checkpoint's loss scale is fixed at 1: this run scales the loss dynamically from {}", fresh.scale));
        fresh
    } else {
        restored
    };
    let gathered = if gather_first { u64::MAX } else { c.state.adam_steps };
    shared.iter_mut().for_each(|s| lock(s).gathered = gathered);
    (c.state.step, c.state.adam_steps, scaler)
}

fn update_rule(train: &TrainConfig, comm: &Comm, replicates: bool) -> Result<UpdateRule> {
    let threads = train.adam_threads;
    match layerwise_config(train) {
        None => {
            let (lr, weight_decay) = (train.lr.peak, train.weight_decay);
            let variance_frozen_after = variance_frozen_after(train);
            let config = AdamConfig { lr, beta1: train.beta1, beta2: train.beta2, eps: train.eps, weight_decay, variance_frozen_after };
            Ok(UpdateRule::AdamW(AdamW::new(config, threads, zerostream_offload::adam::DEFAULT_CHUNK_ELEMS)))
        }
        // Stage 0: each rank holds whole tensors, and their norms are its own.
        Some(config) if replicates => Ok(UpdateRule::Layerwise(Layerwise::new(config, threads), Comm::single())),
        Some(config) => {
            let channel = comm.split().context("--optimizer: a channel for the norms between ranks")?;
            Ok(UpdateRule::Layerwise(Layerwise::new(config, threads), channel))
        }
    }
}

/// The layer-wise optimizer `--optimizer` names, with its settings (None: AdamW).
pub(crate) fn layerwise_config(train: &TrainConfig) -> Option<LayerwiseConfig> {
    let rule = match train.optimizer {
        Optimizer::Adamw => return None,
        Optimizer::Lamb => Rule::Lamb { beta1: train.beta1, beta2: train.beta2, eps: train.eps },
        Optimizer::Lars => Rule::Lars { momentum: train.momentum, trust_coefficient: train.trust_coefficient },
    };
    Some(LayerwiseConfig { lr: train.lr.peak, weight_decay: train.weight_decay, rule, variance_frozen_after: variance_frozen_after(train) })
}

/// `--freeze-variance`: the optimizer step after which the second moment stays (the warm-up's last).
pub(crate) fn variance_frozen_after(train: &TrainConfig) -> Option<u64> {
    train.freeze_variance.then_some(train.grad_compression_warmup)
}

/// Each parameter's index in checkpoint order, by name.
fn checkpoint_order(model: &Model) -> std::collections::HashMap<String, usize> {
    model.checkpoint_specs().into_iter().enumerate().map(|(i, t)| (t.name, i)).collect()
}

/// Refuses to start unless every rank was given the same model and configuration (a hash of both,
/// gathered from every rank): under MPI each process parses its own command line. The flags that
/// differ are named.
fn check_same_configuration(comm: &Comm, config: &Model, train: &TrainConfig) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    // Each process gives AdamW its own machine's cores (0 asks for that share): not compared.
    let train = &TrainConfig { adam_threads: 0, ..train.clone() };
    let whole = crate::comm::fingerprint(format!("{config:?}\n{train:?}").as_bytes());
    let differ = comm.ranks_differing(whole)?;
    if differ.is_empty() {
        return Ok(());
    }
    // Every rank names the same flags (one build's), so the fingerprints pair up.
    let mut items = vec![("the model (--model, --config or --resume)".to_string(), format!("{config:?}"))];
    items.extend(train.to_flags().into_iter().map(|(flag, value)| (format!("--{flag}"), value.to_string())));
    let hashes: Vec<u64> = items.iter().map(|(_, value)| crate::comm::fingerprint(value.as_bytes())).collect();
    let differing = comm.ranks_differing_each(&hashes)?;
    let named: Vec<String> = items.into_iter().zip(differing).filter(|(_, ranks)| !ranks.is_empty()).map(|((what, _), _)| what).collect();
    let what = if named.is_empty() { "a different configuration".to_string() } else { named.join(", ") };
    bail!("ranks {differ:?} were given other values of {what} than rank 0; every rank must get the same flags")
}

/// A parameter tensor on the host: (Hugging Face name, shape, values).
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);
