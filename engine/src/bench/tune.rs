//! `zerostream tune`: times the variants of the fp32 matmul the adapter can run on the products a
//! model's training step makes (forward, input gradient and weight gradient of every linear layer and of
//! the vocabulary projection's chunk, with f32 and 16-bit weights), keeps the fastest per shape class,
//! and writes the table the gpu device loads when it opens (`device/matmul_tuning.rs`). The same for the
//! training attention kernels' variants, forward and backward (`tune/attention.rs`, run first by the
//! command), into the same file (`device/attention_tuning.rs`); and, on an adapter with cooperative
//! matrices, the cooperative-matrix matmul's variants (`--matmul-inputs f16`) on the same products.
//!
//! A variant is accepted only if its result equals the template's plain default's bit for bit on the
//! product it was timed on: the table can change the speed of a run, never its numbers. The baseline,
//! timed first, is the vendor's built-in default ([`MatmulTable::builtin`]: what an untuned device runs),
//! so a class's "default" time and speed-up say what tuning gained on this adapter.

mod attention;
mod upload;
mod variants;

pub use attention::{AttentionCall, AttentionResult, attention_calls, attention_variants, tune_attention};
pub use upload::{DownloadResult, HOST_MARGIN, UploadResult, tune_download, tune_upload};
pub use variants::{Spent, VariantTimes};

use variants::{Candidates, Clock, Hopeless, time_variants, values};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use zerostream_shaders::{AttentionTile, CoopTile, MatmulTile};

use crate::bench::kernels::{Shapes, model_shapes};
use crate::device::attention_tuning::AttentionTable;
use crate::device::gpu::GpuTensor;
use crate::device::matmul_tuning::{
    DownloadEntry, MatmulClass, MatmulTable, TableEntry, TableFile, TableKey, TableSource, UploadEntry, existing_table, table_path,
};
use crate::device::{Backend, GpuDevice, HalfFormat, MatmulInputs, MatmulShape, Operand};

/// What to tune on.
#[derive(Clone, Debug)]
pub struct TuneConfig {
    /// Model shapes: GPT-2 presets (`gpt2`, `gpt2-xl`, ...), Llama presets (`llama-3.2-1b`, ...) or `tiny`.
    pub models: Vec<String>,
    pub batch: usize,
    pub seq_len: usize,
    /// Rows of the vocabulary chunk (`train --vocab-chunk-rows`).
    pub vocab_chunk_rows: usize,
    /// Also the products whose weights are 16-bit (`--precision bf16|fp16` runs).
    pub with_16bit: bool,
    /// Stop starting new classes, matmul or attention, this long after the tune began (those done are kept).
    pub max_seconds: f64,
    /// Only these variants (empty: every one the adapter can run).
    pub variants: Vec<MatmulTile>,
    /// Also the attention kernels' variants.
    pub attention: bool,
    /// Only these attention variants (empty: every one the adapter can run).
    pub attention_variants: Vec<AttentionTile>,
    /// Also the cooperative-matrix matmul's variants, where the adapter has cooperative matrices.
    pub coop: bool,
}

impl TuneConfig {
    /// Tiny shapes: seconds on a software adapter (tests, CI).
    pub fn quick() -> Self {
        TuneConfig {
            models: vec!["tiny".into()],
            batch: 2,
            seq_len: 64,
            vocab_chunk_rows: 1024,
            with_16bit: true,
            max_seconds: 120.0,
            variants: Vec::new(),
            attention: true,
            attention_variants: Vec::new(),
            coop: true,
        }
    }
}

/// One product of a training step.
#[derive(Clone, Debug)]
pub struct Product {
    /// `gpt2 fc forward`, `llama-3.2-1b lm_head dW`, ...
    pub name: String,
    pub shape: MatmulShape,
    pub b_16bit: bool,
}

/// One class's outcome: of the fp32 matmul's variants, or of the cooperative-matrix matmul's.
#[derive(Clone, Debug)]
pub struct ClassResult<V = MatmulTile> {
    pub class: MatmulClass,
    /// The product it was timed on, and every product of the class.
    pub shape: MatmulShape,
    pub products: Vec<String>,
    pub timed: VariantTimes<V>,
}

impl<V> ClassResult<V> {
    pub fn flops(&self) -> f64 {
        2.0 * (self.shape.m * self.shape.n * self.shape.k) as f64
    }
}

/// The products of one training step of `model` at (batch, seq_len), as the model's code makes them.
pub fn step_products(model: &str, batch: usize, seq_len: usize, vocab_chunk_rows: usize, with_16bit: bool) -> Result<Vec<Product>> {
    let bt = batch * seq_len;
    // (linear name, in, out), and whether weights are stored (out, in) as nn.Linear (Llama) or (in, out)
    // as GPT-2's Conv1D.
    let (linears, c, vocab, linear_layout): (Vec<(&str, usize, usize)>, usize, usize, bool) = match model_shapes(model)? {
        Shapes::Gpt2(cfg) => {
            let c = cfg.n_embd;
            (vec![("qkv", c, 3 * c), ("attn_proj", c, c), ("fc", c, 4 * c), ("fc_proj", 4 * c, c)], c, cfg.vocab_size, false)
        }
        Shapes::Products(cfg) => {
            let (c, f) = (cfg.hidden_size, cfg.intermediate_size);
            let (qw, kvw) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
            let linears = vec![
                ("q_proj", c, qw),
                ("k_proj", c, kvw),
                ("v_proj", c, kvw),
                ("o_proj", qw, c),
                ("gate_proj", c, f),
                ("up_proj", c, f),
                ("down_proj", f, c),
            ];
            (linears, c, cfg.vocab_size, true)
        }
    };
    let chunk = vocab.min(vocab_chunk_rows.max(1));
    let mut out = Vec::new();
    let mut push = |name: String, shape: MatmulShape, weight_is_b: bool| {
        out.push(Product { name: name.clone(), shape, b_16bit: false });
        if with_16bit && weight_is_b {
            out.push(Product { name: format!("{name} (16-bit weights)"), shape, b_16bit: true });
        }
    };
    for (name, k, n) in linears {
        let (forward, dinp) = if linear_layout {
            // nn.Linear: y = x W^T, dx = dy W.
            (
                MatmulShape { m: bt, n, k, a: Operand::row_major(k), b: Operand::transposed(k), c: Operand::row_major(n) },
                MatmulShape::row_major(bt, k, n),
            )
        } else {
            // Conv1D: y = x W, dx = dy W^T.
            (
                MatmulShape::row_major(bt, n, k),
                MatmulShape { m: bt, n: k, k: n, a: Operand::row_major(n), b: Operand::transposed(n), c: Operand::row_major(k) },
            )
        };
        // dW = x^T dy (Conv1D) or dy^T x (nn.Linear): A read transposed either way.
        let (rows, cols) = if linear_layout { (n, k) } else { (k, n) };
        let dw =
            MatmulShape { m: rows, n: cols, k: bt, a: Operand::transposed(rows), b: Operand::row_major(cols), c: Operand::row_major(cols) };
        push(format!("{model} {name} forward"), forward, true);
        push(format!("{model} {name} dinp"), dinp, true);
        push(format!("{model} {name} dW"), dw, false);
    }
    let lm_forward =
        MatmulShape { m: bt, n: chunk, k: c, a: Operand::row_major(c), b: Operand::transposed(c), c: Operand::row_major(chunk) };
    push(format!("{model} lm_head forward"), lm_forward, true);
    push(format!("{model} lm_head dinp"), MatmulShape::row_major(bt, c, chunk), true);
    let lm_dw = MatmulShape { m: chunk, n: c, k: bt, a: Operand::transposed(chunk), b: Operand::row_major(c), c: Operand::row_major(c) };
    push(format!("{model} lm_head dW"), lm_dw, false);
    Ok(out)
}

/// Elements an operand of `rows` x `cols` occupies under its strides.
pub(crate) fn operand_len(op: &Operand, rows: usize, cols: usize) -> usize {
    op.offset + (rows.max(1) - 1) * op.row_stride + (cols.max(1) - 1) * op.col_stride + 1
}

struct Operands {
    a: GpuTensor,
    b: GpuTensor,
    c: GpuTensor,
}

fn operands(dev: &GpuDevice, p: &Product, seed: u64) -> Result<Operands> {
    let s = &p.shape;
    let a = dev.alloc(operand_len(&s.a, s.m, s.k), "tune A")?;
    dev.write(&a, &values(operand_len(&s.a, s.m, s.k), seed));
    let b_len = operand_len(&s.b, s.k, s.n);
    let b = if p.b_16bit {
        let t = dev.alloc_16bit(b_len, "tune B", HalfFormat::Bf16)?;
        let bits: Vec<u16> = values(b_len, seed + 1).iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        dev.write_16bit(&t, &bits, HalfFormat::Bf16)?;
        t
    } else {
        let t = dev.alloc(b_len, "tune B")?;
        dev.write(&t, &values(b_len, seed + 1));
        t
    };
    let c = dev.alloc(operand_len(&s.c, s.m, s.n), "tune C")?;
    Ok(Operands { a, b, c })
}

/// Times the candidates (made the device's choice by `force`) on one class's product.
fn tune_class<V: Copy + PartialEq>(
    dev: &GpuDevice,
    p: &Product,
    candidates: &Candidates<V>,
    force: impl Fn(Option<V>) -> Result<()>,
    clock: Clock,
    seed: u64,
) -> Result<Option<VariantTimes<V>>> {
    let setup_start = Instant::now();
    let ops = operands(dev, p, seed)?;
    dev.synchronize();
    let setup_s = setup_start.elapsed().as_secs_f64();
    let run = || dev.matmul(&ops.c, &ops.a, &ops.b, None, &p.shape, false);
    time_variants(dev, candidates, clock, setup_s, force, run, &[&ops.c])
}

/// The shape classes of the configured models' products, in the order first met, each with the product
/// it is timed on and the names of all its products.
fn step_classes(cfg: &TuneConfig) -> Result<Vec<(MatmulClass, Product, Vec<String>)>> {
    let mut classes: Vec<(MatmulClass, Product, Vec<String>)> = Vec::new();
    for model in &cfg.models {
        for p in step_products(model, cfg.batch, cfg.seq_len, cfg.vocab_chunk_rows, cfg.with_16bit)? {
            let class = MatmulClass::of(&p.shape, p.b_16bit);
            match classes.iter_mut().find(|(c, _, _)| *c == class) {
                Some((_, _, names)) => names.push(p.name),
                None => classes.push((class, p.clone(), vec![p.name])),
            }
        }
    }
    Ok(classes)
}

/// `seconds` after `start` (negative or NaN: `start`), at most a century (infinity: no limit).
pub(crate) fn deadline_after(start: Instant, seconds: f64) -> Instant {
    let century = Duration::from_secs(100 * 365 * 86400);
    let wait = Duration::try_from_secs_f64(seconds.max(0.0)).map_or(century, |d| d.min(century));
    start.checked_add(wait).unwrap_or(start)
}

/// Times the candidates on every class, until `until_s` after `start`; `what` names them in the message
/// when time runs out.
#[allow(clippy::too_many_arguments)]
fn tune_classes<V: Copy + PartialEq + std::fmt::Display>(
    dev: &GpuDevice,
    cfg: &TuneConfig,
    start: Instant,
    until_s: f64,
    what: &str,
    candidates: &Candidates<V>,
    force: impl Fn(Option<V>) -> Result<()> + Copy,
    mut on_class: impl FnMut(&ClassResult<V>),
) -> Result<Vec<ClassResult<V>>> {
    let classes = step_classes(cfg)?;
    let clock = Clock { timer: dev.best_timer(), deadline: deadline_after(start, until_s) };
    let mut results = Vec::new();
    let mut hopeless = Hopeless::new(candidates.list, &[candidates.list[0], candidates.reference]);
    for (i, (class, product, names)) in classes.iter().enumerate() {
        let list = match candidates.prune {
            true => hopeless.list_for(class, candidates.list),
            false => candidates.list.to_vec(),
        };
        let these = Candidates { list: &list, ..*candidates };
        let timed = match Instant::now() < clock.deadline {
            true => tune_class(dev, product, &these, force, clock, i as u64 * 7 + 1)?,
            false => None,
        };
        let Some(timed) = timed else {
            eprintln!(
                "tune: {until_s:.0} s of --max-seconds {} used; {} of {} {what} classes left untuned",
                cfg.max_seconds,
                classes.len() - i,
                classes.len()
            );
            break;
        };
        if candidates.prune {
            let before = hopeless.dropped();
            hopeless.count(class, &timed);
            report_dropped(what, candidates.list.len(), &before, &hopeless.dropped(), &timed.mismatched, class, classes.len() - i - 1);
        }
        let result = ClassResult { class: *class, shape: product.shape, products: names.clone(), timed };
        on_class(&result);
        results.push(result);
    }
    Ok(results)
}

/// Says on stderr which variants [`Hopeless`] dropped after `class` (from `before`), or took back:
/// for coming close there, or (`mismatched` there) for giving other bits, which keeps a variant in
/// the lists so that it is named again.
fn report_dropped<V: Copy + PartialEq + std::fmt::Display>(
    what: &str,
    of: usize,
    before: &[V],
    now: &[V],
    mismatched: &[V],
    class: &MatmulClass,
    left: usize,
) {
    let names = |vs: Vec<&V>| vs.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
    let dropped: Vec<&V> = now.iter().filter(|v| !before.contains(v)).collect();
    let (wrong, back): (Vec<&V>, Vec<&V>) = before.iter().filter(|v| !now.contains(v)).partition(|v| mismatched.contains(v));
    if !dropped.is_empty() && left > 0 {
        eprintln!(
            "tune: {} of {of} {what} variants took over {}x their class's best on each of the first {} classes and are not timed on later classes like them (one of their layouts, and M, N and K each within the range all of them span; on others every variant is timed again): {}",
            dropped.len(),
            Hopeless::<V>::RATIO,
            Hopeless::<V>::CLASSES,
            names(dropped)
        );
    }
    if !back.is_empty() {
        eprintln!(
            "tune: {} {what} variants dropped earlier came within {}x of the best on {}, unlike the classes they lost on, and are timed on every class again: {}",
            back.len(),
            Hopeless::<V>::RATIO,
            class.key(),
            names(back)
        );
    }
    if !wrong.is_empty() {
        eprintln!(
            "tune: {} {what} variants dropped earlier gave bits unlike the reference's on {} (the summary names each mismatch) and are timed on every class again, to be named wherever they do: {}",
            wrong.len(),
            class.key(),
            names(wrong)
        );
    }
}

/// Tunes every class of the configured models' products, until `cfg.max_seconds` after `start` (the
/// whole tune's clock, attention's classes included; 60% of it where [`tune_coop`] follows); calls
/// `on_class` as each finishes.
pub fn tune(dev: &GpuDevice, cfg: &TuneConfig, start: Instant, on_class: impl FnMut(&ClassResult)) -> Result<Vec<ClassResult>> {
    let mut variants = if cfg.variants.is_empty() { dev.matmul_variants() } else { cfg.variants.clone() };
    for v in &variants {
        if !dev.matmul_variants().contains(v) {
            bail!("--variants {v}: this adapter cannot run it (workgroup memory or invocations)");
        }
    }
    // The vendor's built-in default first (what an untuned device runs): its time is the baseline a
    // tuned class is compared with; the bits every variant must give are the plain default's.
    let builtin = MatmulTable::builtin(dev.summary()).default;
    let baseline = if dev.matmul_variants().contains(&builtin) { builtin } else { MatmulTile::DEFAULT };
    variants.retain(|v| *v != baseline);
    variants.insert(0, baseline);
    // Where the cooperative-matrix variants follow, they keep the last 40% of the time.
    let until_s = if cfg.coop && !dev.coop_variants().is_empty() { 0.6 * cfg.max_seconds } else { cfg.max_seconds };
    let candidates = Candidates { reference: MatmulTile::DEFAULT, list: &variants, prune: cfg.variants.is_empty() };
    tune_classes(dev, cfg, start, until_s, "matmul", &candidates, |v| dev.force_matmul_variant(v), on_class)
}

/// The cooperative-matrix matmul's variants (`--matmul-inputs f16`) on every class, as [`tune`]; nothing
/// on an adapter without cooperative matrices or with `cfg.coop` off.
pub fn tune_coop(
    dev: &GpuDevice,
    cfg: &TuneConfig,
    start: Instant,
    on_class: impl FnMut(&ClassResult<CoopTile>),
) -> Result<Vec<ClassResult<CoopTile>>> {
    let mut variants = dev.coop_variants(); // the size's default first
    if !cfg.coop || variants.is_empty() {
        return Ok(Vec::new());
    }
    // The vendor's built-in default first, the plain default's bits the reference, as in [`tune`].
    let reference = variants[0];
    let builtin = MatmulTable::builtin(dev.summary()).coop_default_for(reference.coop);
    if let Some(at) = variants.iter().position(|v| *v == builtin) {
        variants.swap(0, at);
    }
    dev.set_matmul_inputs(MatmulInputs::F16)?;
    let candidates = Candidates { reference, list: &variants, prune: true };
    let results =
        tune_classes(dev, cfg, start, cfg.max_seconds, "cooperative-matrix", &candidates, |v| dev.force_coop_variant(v), on_class);
    dev.set_matmul_inputs(MatmulInputs::F32)?;
    results
}

/// The table entry of a tuned matmul class: its winner, with what was measured.
fn class_entry<V: Copy + std::fmt::Display>(r: &ClassResult<V>) -> TableEntry {
    let (best, seconds) = r.timed.best();
    let s = &r.shape;
    TableEntry {
        class: r.class.key(),
        variant: best.to_string(),
        shape: format!("M={} N={} K={}", s.m, s.n, s.k),
        products: r.products.clone(),
        seconds,
        default_seconds: r.timed.default_seconds(),
    }
}

/// Refuses, before anything is timed, a table place `save_table` could not write (minutes of a lent
/// GPU's tuning would otherwise be lost at the end): its directory made and a file written there.
pub fn check_table_place(dev: &GpuDevice) -> Result<()> {
    let path = table_path(dev.summary()).context("no cache directory for the tuning table (set ZEROSTREAM_TUNE_DIR, or pass --no-save)")?;
    let dir = path.parent().context("a tuning table path has a directory")?;
    let advice = "set ZEROSTREAM_TUNE_DIR to a writable directory, or pass --no-save";
    std::fs::create_dir_all(dir).with_context(|| format!("the tuning table's directory {}: cannot create it; {advice}", dir.display()))?;
    let probe = path.with_extension("json.probe");
    std::fs::write(&probe, b"").with_context(|| format!("the tuning table's directory {}: cannot write there; {advice}", dir.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The table from `results`, `attention`, `coop` and the transfer timings, merged over the adapter's
/// previous table for the same key (classes tuned again are replaced, the others kept, as are the upload
/// staging and the read-back when not timed again), written to its place in the cache directory and
/// installed on `dev`.
pub fn save_table(
    dev: &GpuDevice,
    results: &[ClassResult],
    attention: &[AttentionResult],
    coop: &[ClassResult<CoopTile>],
    upload: Option<&UploadResult>,
    download: Option<&DownloadResult>,
) -> Result<std::path::PathBuf> {
    let path = table_path(dev.summary()).context("no cache directory for the tuning table (set ZEROSTREAM_TUNE_DIR)")?;
    let key = TableKey::of(dev.summary());
    let (mut entries, mut attention_entries, mut coop_entries): (BTreeMap<String, TableEntry>, BTreeMap<_, _>, BTreeMap<_, _>) =
        Default::default();
    let (mut upload_entry, mut download_entry) = (None, None);
    // The classes tuned before (in this adapter's own file, or a copied-in one the device found by its
    // key) are kept unless tuned again.
    if let Some(before) = existing_table(dev.summary())
        && let Ok(text) = std::fs::read_to_string(&before)
        && let Ok(old) = serde_json::from_str::<TableFile>(&text)
        && old.key == key
    {
        entries.extend(old.entries.into_iter().map(|e| (e.class.clone(), e)));
        attention_entries.extend(old.attention.into_iter().map(|e| (e.class.clone(), e)));
        coop_entries.extend(old.coop.into_iter().map(|e| (e.class.clone(), e)));
        upload_entry = old.upload;
        download_entry = old.download;
    }
    if let Some(u) = upload {
        upload_entry =
            Some(UploadEntry { staging: u.chosen.name().into(), bytes: u.bytes, mapped_gbps: u.mapped_gbps, host_gbps: u.host_gbps });
    }
    if let Some(d) = download {
        let (read_back, bytes, mapped_gbps, pinned_gbps) = (d.chosen.name().into(), d.bytes, d.mapped_gbps, d.pinned_gbps);
        download_entry = Some(DownloadEntry { read_back, bytes, mapped_gbps, pinned_gbps });
    }
    for r in attention {
        let (best, seconds) = r.timed.best();
        let (class, variant) = (r.class.key(), best.name());
        let (shape, products, default_seconds) = (r.shape(), r.calls.clone(), r.timed.default_seconds());
        attention_entries.insert(class.clone(), TableEntry { class, variant, shape, products, seconds, default_seconds });
    }
    entries.extend(results.iter().map(|r| (r.class.key(), class_entry(r))));
    coop_entries.extend(coop.iter().map(|r| (r.class.key(), class_entry(r))));
    let mut file = TableFile::for_adapter(
        dev.summary(),
        utc_now(),
        entries.into_values().collect(),
        attention_entries.into_values().collect(),
        coop_entries.into_values().collect(),
    );
    file.upload = upload_entry;
    file.download = download_entry;
    file.save(&path)?;
    let source = TableSource::Tuned { path: path.clone(), created: file.created.clone() };
    let attention = AttentionTable { source, entries: crate::device::attention_tuning::entries(&file)? };
    dev.set_matmul_table(MatmulTable::from_file(file, &path, dev.summary())?);
    dev.set_attention_table(attention);
    Ok(path)
}

/// `2026-11-25T10:04:05Z`, from the system clock (civil date from days since 1970, proleptic Gregorian).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

#[cfg(test)]
mod tests;
