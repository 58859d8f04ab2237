//! `zerostream selftest`: every op of [`Backend`] that has a kernel, run on an opened device on seeded
//! random inputs at awkward sizes and compared with its plain-Rust twin ([`crate::ops`]) computed on the
//! host — so on a GPU it checks the WGSL kernels on that adapter, and on the cpu device its fast kernels.
//!
//! Each check ([`Check`]) compares named outputs within `atol + rtol * |ref|` (the tolerances of
//! `tests/kernels.rs`) or bit for bit where equality is the contract (the casts, the dropout masks), and
//! sums them up in a [`CheckResult`] per kernel. A check that panics, or during which wgpu reports an
//! error (a kernel the adapter cannot compile, an invalid dispatch), fails with the words of it while the
//! others still run ([`guarded`]). Backward ops take the twin's forward results as inputs, so each
//! kernel is judged on its own. On a GPU the ops run a second time with 64 KiB bindings, so the paths
//! that split large tensors into windows run too, at this adapter's alignment.
//!
//! The seam for kernel variants: [`check_matmul`] takes the device (running whichever matmul variant it
//! has been set to) and a label, and returns that variant's results; a variant loop runs, per variant,
//! `guarded(dev, &label, |d| check_matmul(d, &label, Size::Full))`. The attention kernels' variants
//! run the same way (`gpu_only::check_attention_variant`).

mod attention;
mod compare;
mod gpu_only;
mod matmul;
mod pointwise;
mod rows;

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use anyhow::Result;

pub use compare::{Check, CheckResult, Mismatch, Tolerance, random, random_tokens};
pub use matmul::{check_matmul, check_matmul_f16_inputs};

use crate::device::{AdapterSummary, AnyDevice, Backend, CpuDevice, GpuDevice, HalfFormat, gpu};
use zerostream_shaders::CoopTile;

/// How much to check: `Full`, the command's default; `Quick`, the largest shapes left out (`--quick`,
/// and the second pass with 64 KiB bindings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Full,
    Quick,
}

impl Size {
    /// `full` in a full run, `quick` in a quick one.
    pub(crate) fn pick<T>(self, full: T, quick: T) -> T {
        match self {
            Size::Full => full,
            Size::Quick => quick,
        }
    }
}

/// A kernel the self-test did not run on this device, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct NotChecked {
    pub kernel: String,
    pub why: String,
}

/// What one self-test found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The device, in words ([`AnyDevice::describe`]).
    pub device: String,
    pub results: Vec<CheckResult>,
    /// What the adapter lacks that zerostream can use, each with what it costs, in words.
    pub lacks: Vec<String>,
    pub not_checked: Vec<NotChecked>,
    pub seconds: f64,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed()).count()
    }
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }
    /// The last line of the command's output: "selftest: N passed, M failed".
    pub fn summary_line(&self) -> String {
        summary_line(self.passed(), self.failed())
    }
    /// The `--json` summary object (`"kind": "summary"`).
    pub fn summary_json(&self) -> serde_json::Value {
        summary_json(&self.device, self.passed(), self.failed(), &self.not_checked, &self.lacks, self.seconds)
    }
}

/// `{"kind": "summary", "adapter", "passed", "failed", "not_checked": [{"kernel", "why"}], "lacks", "seconds"}`.
pub fn summary_json(
    device: &str,
    passed: usize,
    failed: usize,
    not_checked: &[NotChecked],
    lacks: &[String],
    seconds: f64,
) -> serde_json::Value {
    let not_checked: Vec<_> = not_checked.iter().map(|n| serde_json::json!({ "kernel": n.kernel, "why": n.why })).collect();
    serde_json::json!({
        "kind": "summary", "adapter": device, "passed": passed, "failed": failed,
        "not_checked": not_checked, "lacks": lacks, "seconds": seconds,
    })
}

/// "selftest: N passed, M failed".
pub fn summary_line(passed: usize, failed: usize) -> String {
    format!("selftest: {passed} passed, {failed} failed")
}

/// A device the self-test runs on: a [`Backend`] whose own errors can be caught around a check.
pub trait Target: Backend {
    /// Runs `f` and returns the error the device reported meanwhile (wgpu's), in words.
    fn catching(&self, f: &mut dyn FnMut()) -> Option<String>;
}

impl Target for CpuDevice {
    fn catching(&self, f: &mut dyn FnMut()) -> Option<String> {
        f();
        None
    }
}

impl Target for GpuDevice {
    fn catching(&self, f: &mut dyn FnMut()) -> Option<String> {
        self.catch_errors(f)
    }
}

/// Runs one check on `dev`: an error it returns, a panic, or an error the device reports while it runs
/// becomes a failed result named `name` (or fails every result it returned), never a crash.
pub fn guarded<D: Target>(dev: &D, name: &str, check: impl FnOnce(&D) -> Result<Vec<CheckResult>>) -> Vec<CheckResult> {
    let start = Instant::now();
    let mut check = Some(check);
    let mut outcome = None;
    let device_error = dev.catching(&mut || {
        let check = check.take().expect("a check runs once");
        outcome = Some(std::panic::catch_unwind(AssertUnwindSafe(|| check(dev))));
    });
    let failed = |error: String| CheckResult { seconds: start.elapsed().as_secs_f64(), ..CheckResult::failed(name, error) };
    let mut results = match outcome.expect("the check ran") {
        Ok(Ok(results)) if results.is_empty() => vec![failed("no case ran".into())],
        Ok(Ok(results)) => results,
        Ok(Err(e)) => vec![failed(format!("{e:#}"))],
        Err(panic) => {
            let text = panic.downcast_ref::<String>().map(String::as_str).or(panic.downcast_ref::<&str>().copied());
            vec![failed(format!("panicked: {}", text.unwrap_or("(no message)")))]
        }
    };
    if let Some(e) = device_error {
        for r in &mut results {
            r.error = Some(format!("the device reported: {e}"));
        }
    }
    results
}

/// What a progress callback hears: a check about to run, then each result as it is known.
pub enum Event<'a> {
    Started(&'a str),
    Finished(&'a CheckResult),
}

/// One named check of the list.
type Entry<'a, D> = (String, Box<dyn Fn(&D) -> Result<Vec<CheckResult>> + 'a>);

fn entry<'a, D>(name: impl Into<String>, f: impl Fn(&D) -> Result<Vec<CheckResult>> + 'a) -> Entry<'a, D> {
    (name.into(), Box::new(f))
}

/// The checks of every [`Backend`] op, for any device (`with_attention: false` leaves out the training
/// attention, which never splits its work below a sequence: what small bindings are for).
fn backend_entries<'a, D: Backend>(size: Size, with_attention: bool) -> Vec<Entry<'a, D>> {
    let mut entries = vec![
        entry("matmul", move |d| check_matmul(d, "matmul", size)),
        entry("bias_backward", move |d| matmul::check_bias_backward(d, size)),
    ];
    if with_attention {
        entries.push(entry("attention_forward", move |d| attention::check_forward(d, "attention_forward", size)));
        entries.push(entry("attention_backward", move |d| attention::check_backward(d, "attention_backward", size)));
    }
    entries.extend([
        entry("attention_decode", move |d| attention::check_decode(d, size)),
        entry("layernorm", move |d| rows::check_layernorm(d, size)),
        entry("rmsnorm", move |d| rows::check_rmsnorm(d, size)),
        entry("activations", move |d| pointwise::check_activations(d, size)),
        entry("swiglu", move |d| rows::check_swiglu(d, size)),
        entry("rope", move |d| pointwise::check_rope(d, size)),
        entry("encoder", move |d| rows::check_encoder(d, size)),
        entry("crossentropy", move |d| rows::check_crossentropy(d, size)),
        entry("crossentropy_chunks", move |d| rows::check_crossentropy_chunks(d, size)),
        entry("dropout", move |d| pointwise::check_dropout(d, size)),
        entry("elementwise", move |d| pointwise::check_elementwise(d, size)),
        entry("cast_half_to_f32", move |d| pointwise::check_widening(d, size)),
    ]);
    entries
}

/// Runs `entries` on `dev` in order, each [`guarded`], its results' names followed by `suffix`,
/// telling `progress` as it goes.
fn run_entries<D: Target>(dev: &D, entries: Vec<Entry<'_, D>>, suffix: &str, progress: &mut dyn FnMut(Event)) -> Vec<CheckResult> {
    let mut results = Vec::new();
    for (name, check) in entries {
        let name = format!("{name}{suffix}");
        progress(Event::Started(&name));
        for mut r in guarded(dev, &name, |d| check(d)) {
            if !r.kernel.ends_with(suffix) {
                r.kernel += suffix;
            }
            progress(Event::Finished(&r));
            results.push(r);
        }
    }
    results
}

/// The ops again on a second device of the same adapter whose bindings hold at most 64 KiB, so every
/// op splits its work into windows, at the offsets this adapter's alignment gives them (vector loads
/// on or off): the paths large models take, at sizes a self-test can afford. Always the quick shapes:
/// a transposed B with K = 4097 splits into thousands of dispatches under 64 KiB.
fn run_small_bindings(g: &GpuDevice, progress: &mut dyn FnMut(Event)) -> Vec<CheckResult> {
    let size = Size::Quick;
    const SUFFIX: &str = " (64 KiB bindings)";
    match GpuDevice::open(Some(&g.summary().index.to_string()), None) {
        Ok(mut small) => {
            small.limit_binding_bytes_for_tests(64 << 10);
            let mut entries = backend_entries(size, false);
            if small.has_coop_matmul() {
                entries.push(entry("matmul_coop", move |d| check_matmul_f16_inputs(d, "matmul_coop", size)));
            }
            run_entries(&small, entries, SUFFIX, progress)
        }
        Err(e) => {
            let r = CheckResult::failed(&format!("second device{SUFFIX}"), format!("could not open the adapter again: {e:#}"));
            progress(Event::Finished(&r));
            vec![r]
        }
    }
}

/// Runs every check on `dev` (those [`not_checked`] leaves out aside). `progress` hears of each check
/// as it runs.
pub fn run(dev: &AnyDevice, size: Size, progress: &mut dyn FnMut(Event)) -> Report {
    let start = Instant::now();
    let results = match dev {
        AnyDevice::Cpu(cpu) => {
            let mut entries = backend_entries(size, true);
            entries.push(entry("matmul_f16_inputs", move |d| check_matmul_f16_inputs(d, "matmul_f16_inputs", size)));
            run_entries(cpu, entries, "", progress)
        }
        AnyDevice::Gpu(g) => {
            let mut entries: Vec<Entry<GpuDevice>> = vec![entry("compile", gpu_only::check_compile)];
            entries.extend(backend_entries(size, true));
            entries.push(entry("cast_f32_to_f16", move |d| gpu_only::check_cast_to_f16(d, size)));
            // Every fp32 matmul variant a tuning table may choose (quick shapes: the table's own choices
            // ran at full size above).
            for variant in g.matmul_variants() {
                entries.push(entry(format!("matmul {variant}"), move |d| gpu_only::check_matmul_variant(d, variant, Size::Quick)));
            }
            // Every attention variant likewise, both passes (quick cases: the table's ran in full above).
            for variant in g.attention_variants() {
                entries.push(entry(format!("attention {variant}"), move |d| gpu_only::check_attention_variant(d, variant, Size::Quick)));
            }
            if g.has_coop_matmul() {
                entries.push(entry("matmul_coop", move |d| check_matmul_f16_inputs(d, "matmul_coop", size)));
            }
            // Every cooperative-matrix variant bit for bit against the kernel as it was before variants (the
            // check above ran it, or the table's choices, against the twin), quick shapes: the vendor's
            // default included.
            for variant in g.coop_variants().into_iter().filter(|v| *v != CoopTile::default_for(v.coop)) {
                entries.push(entry(format!("matmul_coop {variant}"), move |d| gpu_only::check_coop_variant(d, variant, Size::Quick)));
            }
            // Products too large to pack at once, cut into pieces: with the vendor's default where it
            // packs (NVIDIA's), else the first packing variant.
            let vendor_default = g.coop_size().map(|size| g.matmul_table().coop_default_for(size));
            let first_packing = g.coop_variants().into_iter().find(|v| v.loads.packs_operands());
            let packing = vendor_default.filter(|v| v.loads.packs_operands()).or(first_packing);
            if let Some(variant) = packing.filter(|_| g.has_coop_matmul()) {
                entries.push(entry("matmul_coop packed pieces", move |d| gpu_only::check_coop_packed_pieces(d, variant)));
            }
            if g.copy_queue_unavailable().is_none() {
                entries.push(entry("copy_queue order", gpu_only::check_copy_queue));
            }
            let mut results = run_entries(g, entries, "", progress);
            results.extend(run_small_bindings(g, progress));
            results
        }
    };
    let (device, lacks, not_checked) = (dev.describe(), lacks(dev), not_checked(dev));
    Report { device, results, lacks, not_checked, seconds: start.elapsed().as_secs_f64() }
}

/// The kernels [`run`] leaves out on `dev`, and why: the cooperative-matrix matmul on an adapter
/// without what it needs, and `--copy-queue`'s order where the route cannot be set.
pub fn not_checked(dev: &AnyDevice) -> Vec<NotChecked> {
    let AnyDevice::Gpu(g) = dev else { return Vec::new() };
    let coop = gpu::coop_unavailable(g.summary())
        .map(|why| NotChecked { kernel: "matmul_coop".into(), why: format!("{why}; `--matmul-inputs f16` is refused on this adapter") });
    let copy_queue = g
        .copy_queue_unavailable()
        .map(|why| NotChecked { kernel: "copy_queue order".into(), why: format!("{why}; `--copy-queue` cannot move both ways here") });
    coop.into_iter().chain(copy_queue).collect()
}

/// What the adapter lacks that zerostream uses where it can, each with what it costs, in words (nothing
/// on the cpu device).
pub fn lacks(dev: &AnyDevice) -> Vec<String> {
    match dev {
        AnyDevice::Cpu(_) => Vec::new(),
        AnyDevice::Gpu(g) => adapter_lacks(g.summary()),
    }
}

fn adapter_lacks(a: &AdapterSummary) -> Vec<String> {
    let mut lacks = Vec::new();
    if !a.is_real_gpu() {
        lacks.push(format!("GPU hardware: {:?} is a {:?} adapter (results count, its timings do not)", a.name, a.device_type));
    }
    if !a.timestamp_query {
        lacks.push("timestamp queries: `bench kernels` times each op with the wall clock around submit-and-wait".into());
    }
    if !a.shader_f16 {
        lacks.push("shader-f16: no f16 arithmetic in kernels (the cooperative-matrix matmul needs it)".into());
    }
    if !a.subgroup {
        lacks.push("subgroups: no subgroup operations (the cooperative-matrix matmul needs them)".into());
    }
    if !a.cooperative_matrix {
        lacks.push("cooperative matrices: `--matmul-inputs f16` cannot run".into());
    }
    lacks
}

/// A device tensor holding `data`.
pub(crate) fn upload<D: Backend>(dev: &D, data: &[f32]) -> Result<D::Tensor> {
    let t = dev.alloc(data.len(), "selftest")?;
    dev.write(&t, data);
    Ok(t)
}

/// `values` rounded to 16 bits in `format` (nearest even), as words.
pub(crate) fn halves(format: HalfFormat, values: &[f32]) -> Vec<u16> {
    match format {
        HalfFormat::F16 => values.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect(),
        HalfFormat::Bf16 => values.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect(),
    }
}
