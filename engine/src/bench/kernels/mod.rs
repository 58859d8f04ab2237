//! `zerostream bench kernels`: every kernel a GPT-2 training step runs, timed on the gpu device at the
//! shapes of a chosen model and B x T. Matrix products and attention are reported in GFLOP/s against the
//! adapter's fp32 peak; the other kernels can only be memory-bound and are reported in GB/s (the fewest
//! bytes the op must move: each input read once, each output written once) against the memory peak and
//! against a device-to-device copy measured in the same run. Peaks come from a small datasheet table
//! keyed by the adapter's name ("unknown" otherwise).
//!
//! Inputs are random, never zeros (some devices run faster on zeros). Each kernel is warmed up, then
//! repeated; the time is the median repetition, from GPU timestamps where the adapter has them (see
//! [`crate::device::timing`]). Each row also says how often the op runs in one fp32 training step, so
//! the sum over rows is the device time of a step's kernels.
//!
//! Where the adapter has the cooperative-matrix matmul (`--matmul-inputs f16`), every product is timed
//! again through it (precision `f16-coop`, with the 16-bit B where the fp32 row has a bf16 one), beside
//! the fp32 kernel and against the same fp32 peak; the header says when it is unavailable, and why.
//!
//! Llama presets (`llama-3.2-1b`, ...) time their step's matrix products only, as the model
//! makes them (`tune::step_products`): issue #22's fp32 goal is set at their shapes too. With only
//! some of its kernels timed, such a model gets no step estimate.

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::gpu::GpuTensor;
use crate::device::timing::Timer;
use crate::device::{AttentionDims, Backend, GpuDevice, HalfFormat};
use crate::model::gpt2::Gpt2Config;
use zerostream_checkpoints::LlamaConfig;
mod only;
pub use only::{KERNELS, ROWS};
mod others;
mod products;
mod report;

/// Seconds of repetitions aimed for per kernel when `reps` is 0.
const TARGET_SECONDS: f64 = 0.2;
const MIN_AUTO_REPS: usize = 3;
const MAX_AUTO_REPS: usize = 200;

/// What to measure.
#[derive(Clone, Debug)]
pub struct KernelBenchConfig {
    /// Model shapes: presets ([`crate::model::Model::PRESETS`]; of a Llama, its products only) or `tiny`
    /// (GPT-2, 2 layers, 128 wide, vocabulary 1024).
    pub models: Vec<String>,
    /// B: sequences per micro-batch.
    pub batch: usize,
    /// T: tokens per sequence.
    pub seq_len: usize,
    /// Timed repetitions per kernel; 0 = as many as fill about 0.2 s (3 to 200).
    pub reps: usize,
    /// Only the kernels whose name contains one of these (empty = all).
    pub only: Vec<String>,
    /// Bytes of the device-to-device copy that measures the memory ceiling.
    pub copy_bytes: u64,
    /// Time with the host clock even where the adapter has timestamp queries (to cross-check them).
    pub wall_clock: bool,
}

impl KernelBenchConfig {
    /// Tiny shapes and two repetitions: seconds on a software adapter such as lavapipe (CI).
    pub fn quick() -> Self {
        KernelBenchConfig {
            models: vec!["tiny".into()],
            batch: 2,
            seq_len: 64,
            reps: 2,
            only: Vec::new(),
            copy_bytes: 16 << 20,
            wall_clock: false,
        }
    }
}

/// A model's shape by name: a GPT-2 preset or `tiny`.
pub fn model_config(name: &str) -> Result<Gpt2Config> {
    if name == "tiny" {
        let mut cfg = Gpt2Config::preset("gpt2").expect("the gpt2 preset exists");
        (cfg.vocab_size, cfg.n_embd, cfg.n_layer, cfg.n_head) = (1024, 128, 2, 4);
        return Ok(cfg);
    }
    Gpt2Config::preset(name).with_context(|| not_a_shape(name))
}

/// The refusal of a `--models` name that is no preset and not `tiny`.
fn not_a_shape(name: &str) -> String {
    format!("--models {name:?}: not a model shape ({}, tiny)", crate::model::Model::PRESETS)
}

/// What the bench times of one model.
pub(crate) enum Shapes {
    /// Every kernel of a GPT-2 step.
    Gpt2(Gpt2Config),
    /// A Llama step's matrix products.
    Products(LlamaConfig),
}

/// A model's shapes by name: a GPT-2 preset, `tiny`, or a Llama preset.
pub(crate) fn model_shapes(name: &str) -> Result<Shapes> {
    if name == "tiny" || name.starts_with("gpt2") {
        return model_config(name).map(Shapes::Gpt2);
    }
    LlamaConfig::preset(name).map(Shapes::Products).with_context(|| not_a_shape(name))
}

/// An adapter's datasheet peaks.
#[derive(Clone, Copy, Debug)]
pub struct Peak {
    /// The part the numbers are for.
    pub part: &'static str,
    /// fp32 FMA rate without tensor cores.
    pub fp32_tflops: f64,
    pub mem_gbps: f64,
}

/// Datasheet peaks by the words an adapter's name must contain (lower case; the first match wins).
const PEAKS: &[(&[&str], Peak)] = &[
    (&["h100", "pcie"], Peak { part: "H100 PCIe", fp32_tflops: 51.2, mem_gbps: 2000.0 }),
    (&["h100", "nvl"], Peak { part: "H100 NVL", fp32_tflops: 60.0, mem_gbps: 3900.0 }),
    (&["h100"], Peak { part: "H100 SXM", fp32_tflops: 67.0, mem_gbps: 3350.0 }),
    (&["h200"], Peak { part: "H200", fp32_tflops: 67.0, mem_gbps: 4800.0 }),
    (&["a100", "80gb"], Peak { part: "A100 80GB SXM", fp32_tflops: 19.5, mem_gbps: 2039.0 }),
    (&["a100"], Peak { part: "A100 40GB", fp32_tflops: 19.5, mem_gbps: 1555.0 }),
    (&["l40s"], Peak { part: "L40S", fp32_tflops: 91.6, mem_gbps: 864.0 }),
    (&["rtx 4090"], Peak { part: "RTX 4090", fp32_tflops: 82.6, mem_gbps: 1008.0 }),
];

/// The datasheet peaks of an adapter, if its name is in the table.
pub fn datasheet_peak(adapter_name: &str) -> Option<Peak> {
    let name = adapter_name.to_lowercase();
    PEAKS.iter().find(|(words, _)| words.iter().all(|w| name.contains(w))).map(|(_, p)| *p)
}

/// What limits a kernel when it runs well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Arithmetic: reported in GFLOP/s.
    Compute,
    /// Bytes through device memory: reported in GB/s.
    Memory,
}

/// One kernel at one shape.
#[derive(Clone, Debug)]
pub struct KernelRun {
    /// The model shape (or `device` for the copy).
    pub model: String,
    /// The `Backend` op (the WGSL kernel's name).
    pub kernel: &'static str,
    /// Where the model runs it: "fc forward", "lm_head dW", ...
    pub case: String,
    pub shape: String,
    /// "fp32", or "bf16-B" for the matmul reading a 16-bit B operand; "f16-coop" (and "f16-coop bf16-B")
    /// for the cooperative-matrix matmul of f16-rounded inputs.
    pub precision: &'static str,
    pub bound: Bound,
    pub flops: f64,
    pub bytes: f64,
    /// Median repetition.
    pub seconds: f64,
    pub reps: usize,
    pub timer: Timer,
    /// How often one fp32 training step runs this op at this shape (0: not in the fp32 step).
    pub per_step: usize,
    /// The variant that ran (the device's tuning table's choice), for matmul and attention rows.
    pub variant: Option<String>,
}

impl KernelRun {
    pub fn gflops(&self) -> f64 {
        self.flops / self.seconds / 1e9
    }
    pub fn gbps(&self) -> f64 {
        self.bytes / self.seconds / 1e9
    }
    /// The reported rate's fraction of the datasheet peak for its bound.
    pub fn fraction_of_peak(&self, peak: Option<Peak>) -> Option<f64> {
        peak.map(|p| match self.bound {
            Bound::Compute => self.gflops() / (p.fp32_tflops * 1e3),
            Bound::Memory => self.gbps() / p.mem_gbps,
        })
    }
}

/// The device time of one fp32 training step's kernels: the sum of each op's time and count per step.
#[derive(Clone, Debug)]
pub struct StepEstimate {
    pub model: String,
    pub layers: usize,
    pub seconds: f64,
}

/// Everything `bench kernels` measured.
#[derive(Clone, Debug)]
pub struct KernelBenchReport {
    pub adapter: String,
    /// Which matmul kernel the adapter ran (tile configuration, subgroup or cooperative-matrix use).
    pub matmul_path: String,
    /// Which tuning table chose the fp32 matmul's variants (`MatmulTable::describe`).
    pub matmul_table: String,
    /// The f16-input cooperative-matrix matmul: its path, or why the adapter cannot run it.
    pub matmul_coop: Result<String, String>,
    pub timer: Timer,
    pub peak: Option<Peak>,
    /// Device-to-device copy, bytes read plus written per second.
    pub copy_gbps: f64,
    pub batch: usize,
    pub seq_len: usize,
    pub runs: Vec<KernelRun>,
    /// One per model, when every kernel ran (no `only` filter).
    pub steps: Vec<StepEstimate>,
}

/// Times every kernel at every model shape of `cfg`; `on_run` sees each row as it is measured.
pub fn bench_kernels(dev: &GpuDevice, cfg: &KernelBenchConfig, mut on_run: impl FnMut(&KernelRun)) -> Result<KernelBenchReport> {
    crate::words::require_positive(&[("--batch-size", cfg.batch), ("--seq-len", cfg.seq_len)])?;
    only::check(&cfg.only)?;
    let models = cfg.models.iter().map(|m| Ok((m.clone(), model_shapes(m)?))).collect::<Result<Vec<_>>>()?;
    for (name, shapes) in &models {
        let positions = match shapes {
            Shapes::Gpt2(m) => m.n_positions,
            Shapes::Products(m) => m.max_position_embeddings,
        };
        if cfg.seq_len > positions {
            bail!("--seq-len {} is longer than {name}'s {positions} positions", cfg.seq_len);
        }
        if let Shapes::Gpt2(m) = shapes {
            dev.check_attention(AttentionDims::mha(cfg.batch, cfg.seq_len, m.n_embd, m.n_head))?;
        }
    }
    let timer = if cfg.wall_clock { Timer::WallClock } else { dev.best_timer() };
    let (copy_gbps, copy_bytes) = dev.copy_gbps(cfg.copy_bytes, if cfg.reps > 0 { cfg.reps } else { 20 }, timer)?;
    let copy = KernelRun {
        model: "device".into(),
        kernel: "copy_buffer_to_buffer",
        case: "device-to-device copy".into(),
        shape: format!("{} MiB", copy_bytes >> 20),
        precision: "fp32",
        bound: Bound::Memory,
        flops: 0.0,
        bytes: 2.0 * copy_bytes as f64,
        seconds: 2.0 * copy_bytes as f64 / copy_gbps / 1e9,
        reps: cfg.reps,
        timer,
        per_step: 0,
        variant: None,
    };
    on_run(&copy);
    let mut bench = Bench { dev, cfg, timer, model: String::new(), runs: vec![copy], on_run: &mut on_run };
    let mut steps = Vec::new();
    for (i, (name, shapes)) in models.iter().enumerate() {
        bench.model = name.clone();
        if i == 0 {
            // Once per run, at the first model's grid: the cooperative multiply-add's own rate.
            bench.coop_probe(cfg.batch * cfg.seq_len)?;
        }
        let first = bench.runs.len();
        match shapes {
            Shapes::Gpt2(m) => {
                bench.model_kernels(m)?;
                if cfg.only.is_empty() {
                    let seconds = bench.runs[first..].iter().map(|r| r.per_step as f64 * r.seconds).sum();
                    steps.push(StepEstimate { model: name.clone(), layers: m.n_layer, seconds });
                }
            }
            Shapes::Products(m) => bench.step_products(name, m)?,
        }
    }
    Ok(KernelBenchReport {
        adapter: dev.describe(),
        matmul_path: dev.matmul_path().to_string(),
        matmul_table: dev.matmul_table().describe(),
        matmul_coop: match crate::device::gpu::coop_unavailable(dev.summary()) {
            None => Ok(crate::device::gpu::MATMUL_COOP_PATH.to_string()),
            Some(why) => Err(why),
        },
        timer,
        peak: datasheet_peak(&dev.summary().name),
        copy_gbps,
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        runs: bench.runs,
        steps,
    })
}

/// A kernel case before it is timed.
struct Case {
    kernel: &'static str,
    case: String,
    shape: String,
    precision: &'static str,
    bound: Bound,
    flops: f64,
    bytes: f64,
    per_step: usize,
    variant: Option<String>,
}

impl Case {
    fn memory(kernel: &'static str, case: &str, shape: String, bytes: f64, per_step: usize) -> Self {
        Case { kernel, case: case.into(), shape, precision: "fp32", bound: Bound::Memory, flops: 0.0, bytes, per_step, variant: None }
    }
}

struct Bench<'a> {
    dev: &'a GpuDevice,
    cfg: &'a KernelBenchConfig,
    timer: Timer,
    model: String,
    runs: Vec<KernelRun>,
    on_run: &'a mut dyn FnMut(&KernelRun),
}

/// Bytes of `n` f32 values.
fn f32_bytes(n: usize) -> f64 {
    4.0 * n as f64
}

impl Bench<'_> {
    fn wants(&self, kernel: &str) -> bool {
        debug_assert!(KERNELS.contains(&kernel), "{kernel} is missing from KERNELS, which --only is checked against");
        only::wants_family(&self.cfg.only, kernel)
    }

    /// Warms `op` up, repeats it, and keeps the median repetition. A row `--only` leaves out runs once,
    /// untimed, for the rows after it (a backward reads its forward's outputs).
    fn time(&mut self, c: Case, mut op: impl FnMut()) -> Result<()> {
        debug_assert!(ROWS.contains(&c.kernel), "{} is missing from ROWS, which --only is checked against", c.kernel);
        op(); // pipeline creation and first touch stay out of the numbers
        if !only::keeps_row(&self.cfg.only, c.kernel) {
            return Ok(());
        }
        self.dev.synchronize();
        let reps = match self.cfg.reps {
            0 => {
                let probe = self.dev.time_reps(1, self.timer, &mut op)?.median_s();
                ((TARGET_SECONDS / probe.max(1e-7)).ceil() as usize).clamp(MIN_AUTO_REPS, MAX_AUTO_REPS)
            }
            r => r,
        };
        let timing = self.dev.time_reps(reps, self.timer, &mut op)?;
        let seconds = timing.median_s();
        if !(seconds.is_finite() && seconds > 0.0) {
            bail!("{} {} ({}): the device reported {seconds} s per repetition", c.kernel, c.case, c.shape);
        }
        let run = KernelRun {
            model: self.model.clone(),
            kernel: c.kernel,
            case: c.case,
            shape: c.shape,
            precision: c.precision,
            bound: c.bound,
            flops: c.flops,
            bytes: c.bytes,
            seconds,
            reps,
            timer: timing.timer,
            per_step: c.per_step,
            variant: c.variant,
        };
        (self.on_run)(&run);
        self.runs.push(run);
        Ok(())
    }

    fn model_kernels(&mut self, m: &Gpt2Config) -> Result<()> {
        let (b, t, c, l) = (self.cfg.batch, self.cfg.seq_len, m.n_embd, m.n_layer);
        let bt = b * t;
        for lin in [("qkv", c, 3 * c), ("attn_proj", c, c), ("fc", c, m.hidden()), ("fc_proj", m.hidden(), c)] {
            self.linear(lin, bt, l)?;
        }
        self.lm_head(bt, c, m.vocab_size)?;
        self.attention(AttentionDims::mha(b, t, c, m.n_head), l)?;
        self.layernorm(bt, c, 2 * l + 1)?;
        self.elementwise(bt, c, m.hidden(), l)?;
        self.embeddings(b, t, c, m.vocab_size)?;
        self.crossentropy(bt, m.vocab_size)?;
        self.crossentropy_chunks(bt, m.vocab_size)
    }
}

/// Seeded values in [-scale, scale): a pool of 64Ki tiled, random enough for timing and quick to make
/// at hundreds of millions of elements.
fn random_values(len: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pool: Vec<f32> = (0..len.min(1 << 16)).map(|_| rng.random_range(-scale..scale)).collect();
    pool.iter().copied().cycle().take(len).collect()
}

fn random_tensor(dev: &GpuDevice, len: usize, seed: u64, label: &str) -> Result<GpuTensor> {
    let t = dev.alloc(len, label)?;
    dev.write(&t, &random_values(len, 1.0, seed));
    Ok(t)
}

fn random_bf16_tensor(dev: &GpuDevice, len: usize, seed: u64, label: &str) -> Result<GpuTensor> {
    let t = dev.alloc_16bit(len, label, HalfFormat::Bf16)?;
    let bits: Vec<u16> = random_values(len, 1.0, seed).iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
    dev.write_16bit(&t, &bits, HalfFormat::Bf16)?;
    Ok(t)
}

fn random_ids(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(0..vocab as u32)).collect()
}
