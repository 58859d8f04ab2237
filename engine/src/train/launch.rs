//! The one way into a training run: [`launch`] takes the run a caller asked for ([`RunRequest`]: what
//! the command line resolved from its flags, or what a program built), checks what the library owns —
//! the hyper-parameters, `--resume` against its checkpoint and metrics, the outputs, host RAM and disk,
//! the device (an MPI rank its own node's) — before it says or makes anything, and runs it on one
//! rank, on in-process ranks or as this process's part of an MPI job (`launch/mpi.rs`: MPI started
//! first, so that a refusal on any rank ends the whole job). It returns the run's summary; the
//! caller prints what it likes. [`plan`] is the same walk stopping at the placement.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

mod mpi;
mod resumed;
use resumed::{check_recorded_data, finished_run, resume_from_checkpoint};

use super::ranks::{RankDevice, train_in_process};
use super::run::{ModelChoice, RunOptions, RunSummary, model_config, run_on};
use super::{Placement, TrainConfig, outputs, plan_on, predict};
use crate::device::{AllocCosts, AnyDevice, Backend, DeviceChoice};
use crate::model::Model;

/// Which devices the ranks compute on, and how many ranks.
#[derive(Clone, Debug)]
pub struct RankRequest {
    /// In-process ranks (`--world-size`); None: one, or mpirun's `-n` under mpirun.
    pub world_size: Option<usize>,
    /// One device per rank (`--devices`); empty: every rank on `device`/`adapter`.
    pub devices: Vec<RankDevice>,
    pub device: DeviceChoice,
    pub adapter: Option<String>,
}

impl RankRequest {
    /// Which ranks compute on the cpu device, as `device::open` decides (`--devices cpu,...`,
    /// `--device cpu`, or `auto` finding no GPU: `device::resolve_auto`): (any of them, all of them).
    /// Without `--devices`, every rank is on the default device.
    fn on_cpu(&self) -> (bool, bool) {
        Self::on_cpu_given(&self.devices, self.default_is_cpu())
    }

    /// The allocation costs of each of `world` ranks' devices, for `plan` (which opens none): the cpu
    /// device's where a rank computes on it, a GPU's elsewhere.
    fn costs_by_rank(&self, world: usize) -> Vec<AllocCosts> {
        let default_cpu = self.default_is_cpu();
        let costs = |d: &RankDevice| {
            if Self::on_cpu_given(std::slice::from_ref(d), default_cpu).0 { AllocCosts::CPU } else { AllocCosts::GPU }
        };
        match self.devices.len() {
            0 => vec![costs(&RankDevice::Default); world],
            n if n == world => self.devices.iter().map(costs).collect(),
            // A list of another length is refused when the run starts; planned as a whole here.
            _ => vec![planned_costs(self); world],
        }
    }

    /// Whether the default device is the cpu device, as `device::open` decides.
    fn default_is_cpu(&self) -> bool {
        let default = match self.device {
            DeviceChoice::Auto => crate::device::resolve_auto(self.adapter.as_deref()),
            choice => choice,
        };
        default == DeviceChoice::Cpu
    }

    /// [`Self::on_cpu`] with the default device's answer given.
    fn on_cpu_given(devices: &[RankDevice], default_cpu: bool) -> (bool, bool) {
        let on_cpu = |d: &RankDevice| match d {
            RankDevice::Cpu => true,
            RankDevice::Default => default_cpu,
            RankDevice::Adapter(_) => false,
        };
        if devices.is_empty() { (default_cpu, default_cpu) } else { (devices.iter().any(on_cpu), devices.iter().all(on_cpu)) }
    }
}

/// A training run as asked for, before the library's checks.
pub struct RunRequest {
    pub options: RunOptions,
    pub train: TrainConfig,
    pub ranks: RankRequest,
    /// The flags the user gave (by long name, from the command line or a config file): a resumed run
    /// takes every other setting from its checkpoint.
    pub explicit_flags: BTreeSet<String>,
    /// Of those, the ones not at their defaults: [`super::ignored::ignored_flags`] names the idle ones.
    pub changed_flags: BTreeSet<String>,
    /// `--params-ram-cache auto`: `train.params_ram_cache_bytes` is sized here from the RAM available.
    pub params_ram_cache_auto: bool,
    /// With `--resume`, the `--model` or `--config` also given (flag, model): it must be the checkpoint's.
    pub named_model: Option<(&'static str, ModelChoice)>,
    /// The run's resolved flags as TOML: written beside `--metrics` and into TensorBoard's text.
    pub resolved_config: String,
    /// The `--config-file` the flags came from, never overwritten by the resolved configuration.
    pub config_file: Option<PathBuf>,
    /// `--tensorboard DIR`.
    pub tensorboard: Option<PathBuf>,
}

impl RunRequest {
    /// A library caller's run: `options` and `train` as given, every rank on the default device
    /// (`--device auto`, one rank or mpirun's), no flags counted as given (so a resume, `options.model`
    /// being [`ModelChoice::Resume`], takes every setting and output from its checkpoint: name in
    /// `explicit_flags` those of `train` to keep, by long flag name, e.g. `steps`), and the resolved
    /// configuration beside `--metrics` made from `train`'s settings.
    pub fn new(options: RunOptions, train: TrainConfig) -> Self {
        // TOML has no null, and no integer past i64's (a seed may be): those said as text.
        let toml_of = |v: serde_json::Value| toml::Value::try_from(&v).unwrap_or_else(|_| toml::Value::String(v.to_string()));
        let flags: toml::Table = train.to_flags().into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, toml_of(v))).collect();
        RunRequest {
            options,
            train,
            ranks: RankRequest { world_size: None, devices: Vec::new(), device: DeviceChoice::Auto, adapter: None },
            explicit_flags: BTreeSet::new(),
            changed_flags: BTreeSet::new(),
            params_ram_cache_auto: false,
            named_model: None,
            resolved_config: flags.to_string(),
            config_file: None,
            tensorboard: None,
        }
    }
}

/// Whether this is the first process of its launch (always, outside MPI): the one that speaks for all.
pub fn first_process() -> bool {
    crate::comm::launcher_rank() == 0
}

/// How a launched run ended, for this process.
pub enum Launched {
    /// A resumed run whose checkpoint had reached `--steps`: nothing was trained (exit 0).
    AlreadyDone,
    /// This process's rank and its summary; rank 0's is the run's.
    Ran { rank: usize, summary: RunSummary },
}

/// Checks the request and runs it (see the module's text).
pub fn launch(req: RunRequest) -> Result<Launched> {
    check_request(&req)?;
    let mpi_world = crate::comm::launcher_world_size().filter(|&n| n > 1);
    if let (Some(n), Some(_)) = (mpi_world, req.ranks.world_size) {
        bail!(
            "--world-size cannot be combined with an MPI launch of {n} processes: under mpirun the world size is mpirun's -n; \
             leave --world-size out"
        );
    }
    let world = mpi_world.or(req.ranks.world_size).unwrap_or(1);
    // Under MPI, MPI starts first: a refusal on any rank then ends the whole job, where a rank that
    // ended before starting MPI would leave the others waiting for it in theirs (under srun, say).
    let mpi = mpi_world.map(|_| mpi::start()).transpose()?;
    match (launch_checked(req, world, mpi.as_ref()), &mpi) {
        (Err(e), Some(mpi)) => mpi::abort(mpi, &e),
        (launched, _) => launched,
    }
}

/// [`launch`] once the world is known (`mpi`: this process's part of an MPI job).
fn launch_checked(mut req: RunRequest, world: usize, mpi: Option<&mpi::Mpi>) -> Result<Launched> {
    // First everything that may refuse the run, so that a refused run has said nothing and made no
    // output (the check of --save creates its missing parent folders).
    let resumed = resume_from_checkpoint(&mut req, world)?;
    let metrics_warning = match &resumed {
        Some(r) => r.check(&req)?,
        None => None,
    };
    outputs::check_outputs(&req.options, req.config_file.as_deref(), req.tensorboard.as_deref())?;
    if let Some(r) = resumed.as_ref().filter(|r| r.finished) {
        r.say(&req, metrics_warning);
        return finished_run(&r.dir, r.state.step, req.train.steps, req.options.save.as_deref(), req.options.save_dtype);
    }
    check_recorded_data(&req)?;
    let ranks_here = if mpi.is_some() { crate::comm::launcher_local_size().unwrap_or(world) } else { world };
    // Read once here for the checks below, the MPI rank's and the room warnings.
    let model = model_config(&req.options.model)?;
    size_params_ram_cache(&mut req, &model, world, ranks_here)?;
    let mut one_device = None;
    // An MPI rank checks its node and opens its device here too, and waits for every other rank's
    // checks, so that no rank makes an output for a run another rank refuses.
    let mpi_rank = mpi.map(|mpi| mpi::check_rank(mpi, &req, &model)).transpose()?;
    if mpi.is_none() {
        check_host_room(&req, &model, &req.train, world, world)?;
        let ranks = &req.ranks;
        if world == 1 && ranks.devices.len() > 1 {
            bail!("--devices lists {} devices but --world-size is 1: add --world-size {}", ranks.devices.len(), ranks.devices.len());
        }
        if world > 1 && !ranks.devices.is_empty() && ranks.devices.len() != world {
            let listed = crate::words::counted(ranks.devices.len() as u64, "device");
            bail!("--devices lists {listed} for --world-size {world}: give one per rank");
        }
        if world == 1 {
            let which = ranks.devices.first().cloned().unwrap_or(RankDevice::Default);
            one_device = Some(which.open(ranks.device, ranks.adapter.as_deref(), req.train.gpu_mem_budget)?);
        }
    }
    make_outputs(&mut req, resumed.as_ref(), metrics_warning, &model, world)?;
    if let (Some(mpi), Some(rank)) = (mpi, mpi_rank) {
        return mpi::run_rank(mpi, rank, &req);
    }
    let RunRequest { options, mut train, ranks, .. } = req;
    if let Some(dev) = one_device {
        return Ok(Launched::Ran { rank: 0, summary: run_on(&dev, &options, train)? });
    }
    train.adam_threads = adam_threads_per_rank(train.adam_threads, world);
    let summaries = train_in_process(world, &ranks.devices, ranks.device, ranks.adapter.as_deref(), &options, train)?;
    let summary = summaries.into_iter().next().context("no rank returned a summary")?;
    Ok(Launched::Ran { rank: 0, summary })
}

/// After every check has passed: the one check that makes something (TensorBoard's directory,
/// refused where no file can be written in it), what the run says, and the resolved configuration
/// written before it starts.
fn make_outputs(
    req: &mut RunRequest,
    resumed: Option<&resumed::Resumed>,
    metrics_warning: Option<String>,
    model: &Model,
    world: usize,
) -> Result<()> {
    if let Some(dir) = &req.tensorboard {
        req.options.tensorboard = Some(super::tensorboard::TensorBoard::prepare(dir, &req.resolved_config)?);
    }
    if let Some(r) = resumed {
        r.say(req, metrics_warning);
    }
    if first_process() {
        // Under --quiet too: a full disk would end the run at its first save.
        for warning in outputs::room_warnings(&req.options, model, &req.train) {
            eprintln!("{warning}");
        }
    }
    if first_process() && req.options.progress {
        let (_, cpu_only) = req.ranks.on_cpu();
        let shape = super::ignored::RunShape { world, cpu_only };
        for line in super::ignored::ignored_flags(&req.changed_flags, &req.train, &req.options, shape) {
            eprintln!("note: {line}");
        }
    }
    // A resume appending to the run's own metrics leaves the run's resolved configuration beside them
    // (the resume's command line would not repeat the run).
    let metrics_taken = resumed.is_some() && !req.explicit_flags.contains("metrics");
    // Nothing beside a stream (`--metrics /dev/stdout`).
    let beside = |m: &&PathBuf| (!metrics_taken || !outputs::resolved_path(m).exists()) && !super::metrics_file::is_a_stream(m);
    if let Some(metrics) = req.options.metrics.as_ref().filter(beside) {
        outputs::write_resolved(metrics, &req.resolved_config, req.config_file.as_deref())?;
    }
    Ok(())
}

/// The placement the run would use, without loading weights or training (`zerostream plan`).
pub fn plan(mut req: RunRequest) -> Result<Placement> {
    check_request(&req)?;
    let world = req.ranks.world_size.or_else(crate::comm::launcher_world_size).unwrap_or(1).max(1);
    resume_from_checkpoint(&mut req, world)?;
    let model = planned_model(&req.options.model)?;
    size_params_ram_cache(&mut req, &model, world, world)?;
    super::plan::plan_for_ranks(&model, &req.train, &req.ranks.costs_by_rank(world), planned_costs(&req.ranks))
}

/// The model `plan` plans: a Hugging Face directory's checked against its files' headers too (its
/// weights are never read), so a plan that fits is one that loads.
fn planned_model(choice: &ModelChoice) -> Result<Model> {
    let model = model_config(choice)?;
    if let ModelChoice::Hf(dir) = choice {
        let hf = zerostream_checkpoints::HfModel::open(dir)?;
        model.check_stored_shapes(&hf)?;
        if let Some(warning) = model.unused_tensors_warning(&hf) {
            eprintln!("{warning}");
        }
    }
    Ok(model)
}

/// [`plan`], and the links it would use timed on this machine (`plan --measure`: the drive in
/// `measure`, else in the run's `--nvme-dir`): the placement and the predicted step, in words.
pub fn plan_measured(mut req: RunRequest, measure: &Path) -> Result<(Placement, String)> {
    check_request(&req)?;
    // Not created: a mistyped path (or `-1`) would otherwise time whatever drive holds the new directory.
    if !measure.as_os_str().is_empty() && !measure.is_dir() {
        let what = if measure.exists() { "not a directory" } else { "no such directory" };
        bail!("plan --measure {}: {what} (give an existing directory on the drive to time)", measure.display());
    }
    let world = req.ranks.world_size.or_else(crate::comm::launcher_world_size).unwrap_or(1).max(1);
    resume_from_checkpoint(&mut req, world)?;
    let model = planned_model(&req.options.model)?;
    size_params_ram_cache(&mut req, &model, world, world)?;
    let placement = super::plan::plan_for_ranks(&model, &req.train, &req.ranks.costs_by_rank(world), planned_costs(&req.ranks))?;
    let dirs = predict::drive_dirs(measure, &req.train);
    let dev = RankDevice::Default.open(req.ranks.device, req.ranks.adapter.as_deref(), req.train.gpu_mem_budget)?;
    let (rates, shared_cores, device) = match &dev {
        AnyDevice::Cpu(d) => (predict::measure(d, &model, &req.train, &placement, &dirs)?, predict::shares_cores(d), d.describe()),
        AnyDevice::Gpu(d) => (predict::measure(d, &model, &req.train, &placement, &dirs)?, predict::shares_cores(d), d.describe()),
    };
    let prediction = predict::predict(&rates, &placement, &model, &req.train, shared_cores);
    let mut said = prediction.describe(&rates, &placement);
    match predict::save_rates(&device, &model, &req.train, &dirs, &rates) {
        Ok(Some(path)) if dirs == req.train.nvme_dirs => {
            said += &format!("\nthe rates are kept in {} for `train` with these flags to predict from", path.display())
        }
        Ok(Some(_)) => said += "\n(`train` predicts from rates timed in its own --nvme-dir: `plan --measure` without DIR times those)",
        Ok(None) => said += "\n(no cache directory to keep the rates in for `train`: set ZEROSTREAM_TUNE_DIR)",
        Err(e) => said += &format!("\nwarning: keeping the rates for `train` failed: {e:#}"),
    }
    Ok((placement, said))
}

/// What needs no file: the hyper-parameters and the options against each other.
fn check_request(req: &RunRequest) -> Result<()> {
    req.train.check()?;
    crate::device::check_choice(req.ranks.device, req.ranks.adapter.as_deref())?;
    if matches!(req.options.model, ModelChoice::Resume(_)) {
        return Ok(()); // a resume's checkpoint directory may be the checkpoint's own
    }
    check_checkpoint_flags(&req.options)
}

fn check_checkpoint_flags(options: &RunOptions) -> Result<()> {
    let c = &options.checkpoints;
    if c.dir.is_none() && (c.every > 0 || c.keep > 0) {
        bail!("--checkpoint-every and --keep-checkpoints need --checkpoint-dir DIR");
    }
    Ok(())
}

/// What the ranks' devices charge for their allocations, for planning before they are opened: the cpu
/// device's costs where any rank computes on it ([`RankRequest::on_cpu`]), since its whole memory is
/// RAM, so the RAM planned covers every rank; a GPU's otherwise.
fn planned_costs(ranks: &RankRequest) -> AllocCosts {
    if ranks.on_cpu().0 { AllocCosts::CPU } else { AllocCosts::GPU }
}

/// Refuses before any work a run (`req` with the settings `train`) whose state would not fit in this
/// machine's RAM or on its NVMe directory's disk (`ranks_here` ranks), or whose device budget the
/// chosen device cannot keep.
fn check_host_room(req: &RunRequest, model: &Model, train: &TrainConfig, world: usize, ranks_here: usize) -> Result<()> {
    let placement = plan_on(model, train, world, planned_costs(&req.ranks))?;
    placement.check_host_ram(ranks_here)?;
    placement.check_nvme_room(&train.nvme_dirs, ranks_here)
}

/// `--params-ram-cache auto`: the RAM available now less what `ranks_here` ranks' other state needs
/// (and the devices' share of RAM, `Placement::host_device_bytes`) and a margin, shared by the ranks
/// (`Placement::params_ram_cache_room`); nothing without `auto`. Refused, as a flag that would do
/// nothing, where the working copy is not on NVMe.
fn size_params_ram_cache(req: &mut RunRequest, model: &Model, world: usize, ranks_here: usize) -> Result<()> {
    let asked = req.params_ram_cache_auto || (req.explicit_flags.contains("params-ram-cache") && req.train.params_ram_cache_bytes > 0);
    if asked && req.train.offload_params != zerostream_offload::Tier::Nvme {
        bail!(
            "--params-ram-cache keeps the NVMe tier's working copies in RAM between forward and backward, but this run keeps \
             them in RAM already (--offload-params {}): leave it out, or add --offload-params nvme",
            req.train.offload_params.name()
        );
    }
    if !req.params_ram_cache_auto {
        return Ok(());
    }
    let without = TrainConfig { params_ram_cache_bytes: 0, ..req.train.clone() };
    let placement = plan_on(model, &without, world, planned_costs(&req.ranks))?;
    req.train.params_ram_cache_bytes = placement.params_ram_cache_room(ranks_here);
    Ok(())
}

/// CPU cores each of `ranks` ranks on this machine gets for AdamW, unless --adam-threads says.
fn adam_threads_per_rank(requested: usize, ranks: usize) -> usize {
    if requested > 0 {
        return requested;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run with any rank on the cpu device is planned with the cpu device's costs (its memory is
    /// RAM); one whose ranks all name adapters, with a GPU's, whatever `--device` says.
    #[test]
    fn a_rank_on_the_cpu_device_plans_the_run_with_its_costs() {
        let ranks = |device, devices: Vec<RankDevice>| RankRequest { world_size: Some(2), devices, device, adapter: None };
        let adapter = || RankDevice::Adapter("0".into());
        assert_eq!(planned_costs(&ranks(DeviceChoice::Gpu, vec![])), AllocCosts::GPU);
        assert_eq!(planned_costs(&ranks(DeviceChoice::Cpu, vec![])), AllocCosts::CPU);
        assert_eq!(planned_costs(&ranks(DeviceChoice::Gpu, vec![adapter(), RankDevice::Cpu])), AllocCosts::CPU);
        assert_eq!(planned_costs(&ranks(DeviceChoice::Cpu, vec![adapter(), RankDevice::Default])), AllocCosts::CPU);
        assert_eq!(planned_costs(&ranks(DeviceChoice::Cpu, vec![adapter(), adapter()])), AllocCosts::GPU);
        // `plan` plans each rank with its own device's costs.
        assert_eq!(ranks(DeviceChoice::Gpu, vec![adapter(), RankDevice::Cpu]).costs_by_rank(2), [AllocCosts::GPU, AllocCosts::CPU]);
        assert_eq!(ranks(DeviceChoice::Cpu, vec![]).costs_by_rank(3), [AllocCosts::CPU; 3]);
    }

    /// Any and all ranks on the cpu device, for each way `--devices` and the default can name it.
    #[test]
    fn ranks_on_the_cpu_device_as_open_decides() {
        let gpu = || RankDevice::Adapter("0".into());
        for (devices, default_cpu, want) in [
            (vec![], true, (true, true)),
            (vec![], false, (false, false)),
            (vec![RankDevice::Cpu, RankDevice::Cpu], false, (true, true)),
            (vec![RankDevice::Cpu, gpu()], true, (true, false)),
            (vec![RankDevice::Default, gpu()], true, (true, false)),
            (vec![RankDevice::Default, RankDevice::Cpu], true, (true, true)),
            (vec![RankDevice::Default, RankDevice::Cpu], false, (true, false)),
            (vec![gpu(), gpu()], true, (false, false)),
        ] {
            assert_eq!(RankRequest::on_cpu_given(&devices, default_cpu), want, "{devices:?}, default on the cpu: {default_cpu}");
        }
    }
}
