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

use std::collections::HashSet;

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::device::gpu::GpuTensor;
use crate::device::timing::Timer;
use crate::device::{Activation, AttentionDims, Backend, GpuDevice, HalfFormat, MatmulInputs, MatmulShape, Operand, VocabChunk};
use crate::model::gpt2::Gpt2Config;

/// Seconds of repetitions aimed for per kernel when `reps` is 0.
const TARGET_SECONDS: f64 = 0.2;
const MIN_AUTO_REPS: usize = 3;
const MAX_AUTO_REPS: usize = 200;

/// What to measure.
#[derive(Clone, Debug)]
pub struct KernelBenchConfig {
    /// Model shapes: GPT-2 presets (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or `tiny` (2 layers, 128 wide,
    /// vocabulary 1024).
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
    Gpt2Config::preset(name).with_context(|| format!("--models {name:?}: not a model shape (gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny)"))
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
    /// The fp32 matmul's variant that ran (the device's tuning table's choice), for matmul rows.
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
    if cfg.batch == 0 || cfg.seq_len == 0 {
        bail!("--batch-size and --seq-len must be positive");
    }
    let models = cfg.models.iter().map(|m| Ok((m.clone(), model_config(m)?))).collect::<Result<Vec<_>>>()?;
    for (name, m) in &models {
        if cfg.seq_len > m.n_positions {
            bail!("--seq-len {} is longer than {name}'s n_positions {}", cfg.seq_len, m.n_positions);
        }
        dev.check_attention(AttentionDims::mha(cfg.batch, cfg.seq_len, m.n_embd, m.n_head))?;
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
    for (name, m) in &models {
        bench.model = name.clone();
        let first = bench.runs.len();
        bench.model_kernels(m)?;
        if cfg.only.is_empty() {
            let seconds = bench.runs[first..].iter().map(|r| r.per_step as f64 * r.seconds).sum();
            steps.push(StepEstimate { model: name.clone(), layers: m.n_layer, seconds });
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
        self.cfg.only.is_empty() || self.cfg.only.iter().any(|o| kernel.contains(o.as_str()))
    }

    /// Warms `op` up, repeats it, and keeps the median repetition.
    fn time(&mut self, c: Case, mut op: impl FnMut()) -> Result<()> {
        op(); // pipeline creation and first touch stay out of the numbers
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

/// One product of the model: C = A @ B (+ bias) (+ C), with the bytes it must move.
struct Product<'t> {
    case: String,
    shape: MatmulShape,
    c: &'t GpuTensor,
    a: &'t GpuTensor,
    b: &'t GpuTensor,
    /// B as a 16-bit tensor, when the model may hold B in 16 bits (a weight).
    b16: Option<&'t GpuTensor>,
    bias: Option<&'t GpuTensor>,
    accumulate: bool,
    per_step: usize,
}

impl Bench<'_> {
    /// Times a product in fp32 and, when B is a weight, with B in bf16.
    fn product(&mut self, p: Product<'_>) -> Result<()> {
        let s = p.shape;
        let (m, n, k) = (s.m, s.n, s.k);
        let out_bytes = f32_bytes(m * n) * if p.accumulate { 2.0 } else { 1.0 };
        let bias_bytes = if p.bias.is_some() { f32_bytes(n) } else { 0.0 };
        let in_bytes = f32_bytes(m * k) + bias_bytes + out_bytes;
        let shape = format!("M={m} N={n} K={k}");
        let dev = self.dev;
        for (b, precision, b_bytes) in [(Some(p.b), "fp32", f32_bytes(k * n)), (p.b16, "bf16-B", 2.0 * (k * n) as f64)] {
            let Some(b) = b else { continue };
            let case = Case {
                kernel: "matmul",
                case: p.case.clone(),
                shape: shape.clone(),
                precision,
                bound: Bound::Compute,
                flops: s.flops(),
                bytes: in_bytes + b_bytes,
                per_step: if precision == "fp32" { p.per_step } else { 0 },
                variant: Some(dev.matmul_variant_for(&s, precision == "bf16-B").name()),
            };
            self.time(case, || dev.matmul(p.c, p.a, b, p.bias, &s, p.accumulate))?;
        }
        if dev.has_coop_matmul() {
            // The 16-bit path: f16-rounded inputs on cooperative matrices, with the 16-bit B when the
            // product has one (the weights of a bf16 working copy), as a training step would run it.
            let (b, precision, b_bytes) = match p.b16 {
                Some(b16) => (b16, "f16-coop bf16-B", 2.0 * (k * n) as f64),
                None => (p.b, "f16-coop", f32_bytes(k * n)),
            };
            let case = Case {
                kernel: "matmul",
                case: p.case.clone(),
                shape,
                precision,
                bound: Bound::Compute,
                flops: s.flops(),
                bytes: in_bytes + b_bytes,
                per_step: 0,
                variant: None,
            };
            dev.set_matmul_inputs(MatmulInputs::F16)?;
            let timed = self.time(case, || dev.matmul(p.c, p.a, b, p.bias, &s, p.accumulate));
            dev.set_matmul_inputs(MatmulInputs::F32)?;
            timed?;
        }
        Ok(())
    }

    /// A linear layer (in `k`, out `n`): forward, the input gradient, the weight gradient, the bias gradient.
    fn linear(&mut self, (name, k, n): (&str, usize, usize), bt: usize, layers: usize) -> Result<()> {
        let dev = self.dev;
        if self.wants("matmul") {
            let inp = random_tensor(dev, bt * k, 1, "input")?;
            let w = random_tensor(dev, k * n, 2, "weight")?;
            let w16 = random_bf16_tensor(dev, k * n, 2, "weight bf16")?;
            let bias = random_tensor(dev, n, 3, "bias")?;
            let out = dev.alloc(bt * n, "output")?;
            let dout = random_tensor(dev, bt * n, 4, "d output")?;
            let (dinp, dw) = (dev.alloc(bt * k, "d input")?, dev.alloc(k * n, "d weight")?);
            let products = [
                Product {
                    case: format!("{name} forward"),
                    shape: MatmulShape::row_major(bt, n, k),
                    c: &out,
                    a: &inp,
                    b: &w,
                    b16: Some(&w16),
                    bias: Some(&bias),
                    accumulate: false,
                    per_step: layers,
                },
                Product {
                    case: format!("{name} dinp"),
                    shape: MatmulShape { m: bt, n: k, k: n, a: Operand::row_major(n), b: Operand::transposed(n), c: Operand::row_major(k) },
                    c: &dinp,
                    a: &dout,
                    b: &w,
                    b16: Some(&w16),
                    bias: None,
                    accumulate: false,
                    per_step: layers,
                },
                Product {
                    case: format!("{name} dW"),
                    shape: MatmulShape { m: k, n, k: bt, a: Operand::transposed(k), b: Operand::row_major(n), c: Operand::row_major(n) },
                    c: &dw,
                    a: &inp,
                    b: &dout,
                    b16: None,
                    bias: None,
                    accumulate: true,
                    per_step: layers,
                },
            ];
            for p in products {
                self.product(p)?;
            }
        }
        if self.wants("bias_backward") {
            let dout = random_tensor(dev, bt * n, 4, "d output")?;
            let dbias = dev.alloc(n, "d bias")?;
            let case = Case::memory("bias_backward", &format!("{name} dbias"), format!("M={bt} N={n}"), f32_bytes(bt * n + 2 * n), layers);
            self.time(case, || dev.bias_backward(&dbias, &dout, bt, n))?;
        }
        Ok(())
    }

    /// The tied lm_head: logits = ln_f @ wte^T, and its two gradients.
    fn lm_head(&mut self, bt: usize, c: usize, v: usize) -> Result<()> {
        if !self.wants("matmul") {
            return Ok(());
        }
        let dev = self.dev;
        let wte = random_tensor(dev, v * c, 5, "wte")?;
        let wte16 = random_bf16_tensor(dev, v * c, 5, "wte bf16")?;
        let ln_f = random_tensor(dev, bt * c, 6, "ln_f")?;
        let logits = random_tensor(dev, bt * v, 7, "logits")?;
        let (d_ln_f, dwte) = (dev.alloc(bt * c, "d ln_f")?, dev.alloc(v * c, "d wte")?);
        let products = [
            Product {
                case: "lm_head forward".into(),
                shape: MatmulShape { m: bt, n: v, k: c, a: Operand::row_major(c), b: Operand::transposed(c), c: Operand::row_major(v) },
                c: &logits,
                a: &ln_f,
                b: &wte,
                b16: Some(&wte16),
                bias: None,
                accumulate: false,
                per_step: 1,
            },
            Product {
                case: "lm_head dinp".into(),
                shape: MatmulShape::row_major(bt, c, v),
                c: &d_ln_f,
                a: &logits,
                b: &wte,
                b16: Some(&wte16),
                bias: None,
                accumulate: false,
                per_step: 1,
            },
            Product {
                case: "lm_head dW".into(),
                shape: MatmulShape { m: v, n: c, k: bt, a: Operand::transposed(v), b: Operand::row_major(c), c: Operand::row_major(c) },
                c: &dwte,
                a: &logits,
                b: &ln_f,
                b16: None,
                bias: None,
                accumulate: true,
                per_step: 1,
            },
        ];
        for p in products {
            self.product(p)?;
        }
        Ok(())
    }
}

impl Bench<'_> {
    /// Causal attention forward and backward. FLOPs count the causal half only: forward 4 x hd per
    /// (query, key) pair (q.k and p.v), backward 2.5 times that (FlashAttention's convention).
    fn attention(&mut self, d: AttentionDims, layers: usize) -> Result<()> {
        if !self.wants("attention") {
            return Ok(());
        }
        let dev = self.dev;
        let (bt, c, stat) = (d.batch * d.seq_len, d.out_width(), d.stat_len());
        let qkv = random_tensor(dev, bt * d.qkv_width(), 8, "qkv")?;
        let (out, lse) = (dev.alloc(bt * c, "attention out")?, dev.alloc(stat, "lse")?);
        let dout = random_tensor(dev, bt * c, 9, "d attention out")?;
        let (dqkv, delta) = (dev.alloc(bt * d.qkv_width(), "d qkv")?, dev.alloc(stat, "delta")?);
        let pairs = (d.seq_len * (d.seq_len + 1) / 2) as f64;
        let forward_flops = 4.0 * (d.batch * d.heads * d.head_dim) as f64 * pairs;
        let shape = format!("B={} T={} NH={} hd={}", d.batch, d.seq_len, d.heads, d.head_dim);
        let compute = |kernel, flops, bytes| Case {
            kernel,
            case: "causal self-attention".into(),
            shape: shape.clone(),
            precision: "fp32",
            bound: Bound::Compute,
            flops,
            bytes,
            per_step: layers,
            variant: None,
        };
        let forward = compute("attention_forward", forward_flops, f32_bytes(4 * bt * c + stat));
        self.time(forward, || dev.attention_forward(&out, &lse, &qkv, d))?;
        let backward = compute("attention_backward", 2.5 * forward_flops, f32_bytes(6 * bt * c + 2 * bt * c + 2 * stat));
        self.time(backward, || dev.attention_backward(&dqkv, &delta, &dout, &qkv, &out, &lse, d))
    }

    /// Layer norm forward and backward over (BT, C); the backward accumulates into dx, dweight, dbias.
    fn layernorm(&mut self, bt: usize, c: usize, per_step: usize) -> Result<()> {
        if !self.wants("layernorm") {
            return Ok(());
        }
        let dev = self.dev;
        let x = random_tensor(dev, bt * c, 10, "x")?;
        let (weight, bias) = (random_tensor(dev, c, 11, "ln weight")?, random_tensor(dev, c, 12, "ln bias")?);
        let (out, mean, rstd) = (dev.alloc(bt * c, "ln out")?, dev.alloc(bt, "mean")?, dev.alloc(bt, "rstd")?);
        let dout = random_tensor(dev, bt * c, 13, "d ln out")?;
        let (dx, dweight, dbias) = (dev.alloc(bt * c, "dx")?, dev.alloc(c, "d ln weight")?, dev.alloc(c, "d ln bias")?);
        let shape = format!("BT={bt} C={c}");
        let forward =
            Case::memory("layernorm_forward", "ln_1, ln_2, ln_f", shape.clone(), f32_bytes(2 * bt * c + 2 * bt + 2 * c), per_step);
        self.time(forward, || dev.layernorm_forward(&out, &mean, &rstd, &x, &weight, &bias, bt, c, 1e-5))?;
        let backward = Case::memory("layernorm_backward", "ln_1, ln_2, ln_f", shape, f32_bytes(4 * bt * c + 2 * bt + 5 * c), per_step);
        self.time(backward, || dev.layernorm_backward(&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd, bt, c))
    }

    /// GELU over the MLP's hidden activations, the residual additions, the zeroing of a gradient buffer,
    /// axpy, and the 16-bit casts.
    fn elementwise(&mut self, bt: usize, c: usize, hidden: usize, layers: usize) -> Result<()> {
        let dev = self.dev;
        let (nh, nc) = (bt * hidden, bt * c);
        let (h_shape, c_shape) = (format!("{nh} = BT x 4C"), format!("{nc} = BT x C"));
        if self.wants("gelu") {
            let x = random_tensor(dev, nh, 14, "gelu x")?;
            let (out, dout, dx) = (dev.alloc(nh, "gelu out")?, random_tensor(dev, nh, 15, "d gelu out")?, dev.alloc(nh, "gelu dx")?);
            let forward = Case::memory("gelu_forward", "mlp", h_shape.clone(), f32_bytes(2 * nh), layers);
            self.time(forward, || dev.activation_forward(Activation::GeluTanh, &out, &x))?;
            let backward = Case::memory("gelu_backward", "mlp (dx +=)", h_shape.clone(), f32_bytes(4 * nh), layers);
            self.time(backward, || dev.activation_backward(Activation::GeluTanh, &dx, &x, &dout))?;
        }
        let a = random_tensor(dev, nc, 16, "a")?;
        let y = random_tensor(dev, nc, 17, "b")?;
        if self.wants("residual") {
            let out = dev.alloc(nc, "residual out")?;
            let case = Case::memory("residual_forward", "residual stream", c_shape.clone(), f32_bytes(3 * nc), 2 * layers);
            self.time(case, || dev.residual_forward(&out, &a, &y))?;
        }
        if self.wants("axpy") {
            let case = Case::memory("axpy", "y = a x + b y (not in the step)", c_shape.clone(), f32_bytes(3 * nc), 0);
            self.time(case, || dev.axpy(&y, 0.5, &a, 0.5))?;
        }
        if self.wants("fill") {
            let buffer = dev.alloc(nh, "fill target")?;
            let case = Case::memory("fill", "zero d_hidden", h_shape, f32_bytes(nh), layers);
            self.time(case, || dev.fill(&buffer, 0.0))?;
        }
        if self.wants("cast") {
            let values = random_values(nc, 1.0, 18);
            let bits: Vec<u16> = values.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
            let words: Vec<u32> = bits.chunks(2).map(|p| p[0] as u32 | (p.get(1).copied().unwrap_or(0) as u32) << 16).collect();
            let packed = dev.upload_words(&words, "bf16 words")?;
            let wide = dev.alloc(nc, "widened")?;
            let case = Case::memory("cast_half_to_f32", "bf16 upload widening", c_shape.clone(), 6.0 * nc as f64, 0);
            self.time(case, || dev.cast_bf16_to_f32(&wide, &packed, nc))?;
            let case = Case::memory("cast_f32_to_f16", "f32 to f16 (not in the step)", c_shape, 6.0 * nc as f64, 0);
            self.time(case, || dev.cast_f32_to_f16(&packed, &a, nc))?;
        }
        Ok(())
    }

    /// Token and position embedding forward, and its backward (the gather's scatter, by token bucket).
    fn embeddings(&mut self, b: usize, t: usize, c: usize, v: usize) -> Result<()> {
        if !self.wants("encoder") {
            return Ok(());
        }
        let dev = self.dev;
        let bt = b * t;
        let ids = random_ids(bt, v, 19);
        let distinct = ids.iter().collect::<HashSet<_>>().len();
        let tokens = dev.tokens(&ids)?;
        let (wte, wpe) = (random_tensor(dev, v * c, 20, "wte")?, random_tensor(dev, t * c, 21, "wpe")?);
        let out = dev.alloc(bt * c, "embedded")?;
        let dout = random_tensor(dev, bt * c, 22, "d embedded")?;
        let (dwte, dwpe) = (dev.alloc(v * c, "d wte")?, dev.alloc(t * c, "d wpe")?);
        let shape = format!("B={b} T={t} C={c} V={v}");
        // Forward reads each token's row and the position rows and writes (BT, C); backward reads
        // d(out) once and reads and writes each distinct token's row and the position rows.
        let forward = Case::memory("encoder_forward", "wte[tokens] + wpe", shape.clone(), f32_bytes(2 * bt * c + t * c + bt), 1);
        self.time(forward, || dev.encoder_forward(&out, &tokens, &wte, &wpe, t, c))?;
        let backward_bytes = f32_bytes(bt * c + 2 * distinct * c + 2 * t * c + 2 * bt);
        let backward = Case::memory("encoder_backward", "dwte, dwpe +=", shape, backward_bytes, 1);
        self.time(backward, || dev.encoder_backward(&dwte, &dwpe, &dout, &tokens, b, t, c))
    }

    /// The fused softmax cross-entropy over whole rows (what training ran before the loss went by
    /// vocabulary chunks; not counted in the step).
    fn crossentropy(&mut self, bt: usize, v: usize) -> Result<()> {
        if !self.wants("crossentropy") {
            return Ok(());
        }
        let dev = self.dev;
        let logits = dev.alloc(bt * v, "logits")?;
        dev.write(&logits, &random_values(bt * v, 4.0, 23));
        let targets = dev.tokens(&random_ids(bt, v, 24))?;
        let losses = dev.alloc(bt, "losses")?;
        let case = Case::memory(
            "crossentropy",
            "softmax + loss + dlogits (not in the step)",
            format!("BT={bt} V={v}"),
            f32_bytes(2 * bt * v + 2 * bt),
            0,
        );
        // Each repetition reads the previous one's gradients as logits: other values, same work.
        self.time(case, || dev.crossentropy(&losses, &logits, &targets, v, Some(1.0 / bt as f32)))
    }

    /// The vocabulary-chunked cross-entropy's two kernels (what training runs, `model::vocab`) on the
    /// first chunk of CHUNK_COLS columns of the (BT, V) logits (row stride V, as when the whole matrix
    /// is kept), counted once per chunk in the step.
    fn crossentropy_chunks(&mut self, bt: usize, v: usize) -> Result<()> {
        const CHUNK_COLS: usize = crate::model::vocab::DEFAULT_CHUNK_ROWS;
        if !self.wants("crossentropy_chunk_stats") && !self.wants("crossentropy_chunk_grad") {
            return Ok(());
        }
        let dev = self.dev;
        let logits = dev.alloc(bt * v, "logits")?;
        dev.write(&logits, &random_values(bt * v, 4.0, 25));
        let targets = dev.tokens(&random_ids(bt, v, 26))?;
        let (cols, n_chunks) = (CHUNK_COLS.min(v), v.div_ceil(CHUNK_COLS));
        let chunk = VocabChunk { rows: bt, start: 0, cols, index: 0, n_chunks, offset: 0, row_stride: v };
        let shape = format!("BT={bt} cols={cols} V={v}");
        if self.wants("crossentropy_chunk_stats") {
            let stats = dev.alloc(bt * n_chunks * 3, "chunk stats")?;
            let bytes = f32_bytes(bt * cols + 3 * bt + bt);
            let case = Case::memory("crossentropy_chunk_stats", "max, sum exp, target", shape.clone(), bytes, n_chunks);
            self.time(case, || dev.crossentropy_chunk_stats(&stats, &logits, &targets, &chunk))?;
        }
        if self.wants("crossentropy_chunk_grad") {
            // An lse near the logits' own keeps exp(x - lse) in range repetition after repetition.
            let lse = dev.alloc(bt, "lse")?;
            dev.write(&lse, &vec![12.0; bt]);
            let case = Case::memory("crossentropy_chunk_grad", "dlogits in place", shape, f32_bytes(2 * bt * cols + 2 * bt), n_chunks);
            self.time(case, || dev.crossentropy_chunk_grad(&logits, &lse, &targets, &chunk, 1.0 / bt as f32))?;
        }
        Ok(())
    }
}

impl KernelBenchReport {
    /// The time share of each row in its model's step, when there is a step estimate.
    pub fn share_of_step(&self, run: &KernelRun) -> Option<f64> {
        let step = self.steps.iter().find(|s| s.model == run.model)?;
        Some(run.per_step as f64 * run.seconds / step.seconds)
    }

    /// One JSON object per kernel and shape.
    pub fn run_json(&self, r: &KernelRun) -> serde_json::Value {
        let compute = r.bound == Bound::Compute;
        serde_json::json!({
            "adapter": self.adapter, "model": r.model, "batch": self.batch, "seq_len": self.seq_len,
            "matmul_path": if r.precision.starts_with("f16-coop") { crate::device::gpu::MATMUL_COOP_PATH } else { self.matmul_path.as_str() },
            "matmul_coop": match &self.matmul_coop { Ok(_) => "available".to_string(), Err(why) => format!("unavailable on this adapter: {why}") },
            "kernel": r.kernel, "case": r.case, "shape": r.shape, "precision": r.precision,
            "bound": if compute { "compute" } else { "memory" },
            "flops": r.flops, "bytes": r.bytes, "seconds": r.seconds, "reps": r.reps, "timer": r.timer.name(),
            "gflops": if compute { Some(r.gflops()) } else { None },
            "gbps": r.gbps(),
            "peak_part": self.peak.map(|p| p.part),
            "peak_fp32_gflops": self.peak.map(|p| p.fp32_tflops * 1e3),
            "peak_mem_gbps": self.peak.map(|p| p.mem_gbps),
            "fraction_of_peak": r.fraction_of_peak(self.peak),
            "copy_gbps": self.copy_gbps,
            "fraction_of_copy": if compute { None } else { Some(r.gbps() / self.copy_gbps) },
            "per_step": r.per_step,
            "share_of_step": self.share_of_step(r),
            "variant": r.variant,
            "matmul_table": self.matmul_table,
        })
    }

    /// One JSON object per model: the device time of a step's kernels.
    pub fn step_json(&self, s: &StepEstimate) -> serde_json::Value {
        serde_json::json!({
            "adapter": self.adapter, "model": s.model, "batch": self.batch, "seq_len": self.seq_len,
            "layers": s.layers, "step_kernel_seconds": s.seconds, "timer": self.timer.name(),
            "tokens_per_s_at_full_busy": (self.batch * self.seq_len) as f64 / s.seconds,
        })
    }

    /// The table `bench kernels` prints.
    pub fn table(&self) -> String {
        let mut out = format!("adapter: {}; timer: {}", self.adapter, self.timer.name());
        if self.timer == Timer::WallClock {
            out += " (host clock around submit-and-wait: each time includes submission and wake-up latency)";
        }
        out += &match self.peak {
            Some(p) => format!("\npeak ({} datasheet): {:.1} TFLOP/s fp32, {:.0} GB/s", p.part, p.fp32_tflops, p.mem_gbps),
            None => "\npeak: unknown (adapter not in the datasheet table); memory-bound rows are also shown against the copy".into(),
        };
        out += &format!(
            "\nmeasured device-to-device copy: {:.1} GB/s (read + written); B={} T={}\nmatmul: {}\nmatmul variants: {}\nmatmul f16-coop: {}\n",
            self.copy_gbps,
            self.batch,
            self.seq_len,
            self.matmul_path,
            self.matmul_table,
            match &self.matmul_coop {
                Ok(path) => format!("{path} (rows f16-coop; % peak against the fp32 peak)"),
                Err(why) => format!("unavailable on this adapter ({why})"),
            }
        );
        out += &format!(
            "{:<8} {:<22} {:<54} {:<15} {:<23} {:>6} {:>11} {:>16} {:>7} {:>7} {:>6}\n",
            "model", "kernel", "case [matmul variant]", "prec", "shape", "x/step", "time (us)", "rate", "% peak", "% copy", "% step"
        );
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}", 100.0 * v));
        for r in &self.runs {
            let case = match &r.variant {
                Some(v) => format!("{} [{v}]", r.case),
                None => r.case.clone(),
            };
            let (rate, copy) = match r.bound {
                Bound::Compute => (format!("{:.1} GFLOP/s", r.gflops()), None),
                Bound::Memory => (format!("{:.1} GB/s", r.gbps()), Some(r.gbps() / self.copy_gbps)),
            };
            out += &format!(
                "{:<8} {:<22} {:<54} {:<15} {:<23} {:>6} {:>11.1} {:>16} {:>7} {:>7} {:>6}\n",
                r.model,
                r.kernel,
                case,
                r.precision,
                r.shape,
                r.per_step,
                r.seconds * 1e6,
                rate,
                pct(r.fraction_of_peak(self.peak)),
                pct(copy),
                pct(self.share_of_step(r)),
            );
        }
        for s in &self.steps {
            out += &format!(
                "{}: the kernels of one fp32 training step (B={}, T={}, {} layers) take {:.2} ms of device time: {:.0} tokens/s if the device never waited\n",
                s.model,
                self.batch,
                self.seq_len,
                s.layers,
                s.seconds * 1e3,
                (self.batch * self.seq_len) as f64 / s.seconds
            );
        }
        out
    }
}
