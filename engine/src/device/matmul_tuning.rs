//! Which fp32 matmul variant ([`MatmulTile`]) and which cooperative-matrix variant ([`CoopTile`], under
//! `--matmul-inputs f16`) the gpu device runs for a product: the table that
//! `zerostream tune` writes per adapter, driver and zerostream version into the user's cache
//! directory, loaded when the device opens, or a built-in default per vendor where none was tuned.
//!
//! Products are grouped into shape classes ([`MatmulClass`]: the operands' layouts, a 16-bit B, and M,
//! N and K in half-octave buckets), so a table tuned on one model's shapes serves products of about the
//! same sizes. Any variant gives the same bits (`shaders/src/matmul_template.rs`), so the table only
//! ever changes the speed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zerostream_shaders::{CoopTile, MatmulTile};

use super::adapter::AdapterSummary;
use super::{ReadBack, UploadStaging};
use crate::ops::MatmulShape;

/// The environment variable that overrides where tuning tables live (tests, read-only homes).
pub const TUNE_DIR_ENV: &str = "ZEROSTREAM_TUNE_DIR";

/// A product's shape class: what the tuner times once and the device looks up for every product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MatmulClass {
    /// A read along M (a transposed operand, as in dW = X^T dY).
    pub a_transposed: bool,
    /// B read along K (a transposed operand, as in dX = dY W^T, or nn.Linear's forward).
    pub b_transposed: bool,
    /// B stored in 16 bits (a bf16/fp16 working copy's weights).
    pub b_16bit: bool,
    /// round(2 log2(x)) of M, N and K: half-octave buckets.
    pub m_bucket: u8,
    pub n_bucket: u8,
    pub k_bucket: u8,
}

/// round(2 log2(x)): the half-octave bucket of a size (the attention table buckets T the same way).
pub(crate) fn bucket(x: usize) -> u8 {
    (2.0 * (x.max(1) as f64).log2()).round() as u8
}

impl MatmulClass {
    pub fn of(shape: &MatmulShape, b_16bit: bool) -> Self {
        MatmulClass {
            a_transposed: shape.a.row_stride == 1 && shape.a.col_stride != 1,
            b_transposed: shape.b.row_stride == 1 && shape.b.col_stride != 1,
            b_16bit,
            m_bucket: bucket(shape.m),
            n_bucket: bucket(shape.n),
            k_bucket: bucket(shape.k),
        }
    }

    /// `tn/f32/m24/n19/k19`: layouts of A and B (`n` as stored, `t` transposed), B's storage, buckets.
    pub fn key(&self) -> String {
        format!(
            "{}{}/{}/m{}/n{}/k{}",
            if self.a_transposed { 't' } else { 'n' },
            if self.b_transposed { 't' } else { 'n' },
            if self.b_16bit { "b16" } else { "f32" },
            self.m_bucket,
            self.n_bucket,
            self.k_bucket
        )
    }

    pub fn parse(key: &str) -> Option<Self> {
        let parts: Vec<&str> = key.split('/').collect();
        let [layout, b, m, n, k] = parts[..] else { return None };
        let mut layout = layout.chars();
        let flag = |c: Option<char>| match c {
            Some('n') => Some(false),
            Some('t') => Some(true),
            _ => None,
        };
        let (a_transposed, b_transposed) = (flag(layout.next())?, flag(layout.next())?);
        let b_16bit = match b {
            "f32" => false,
            "b16" => true,
            _ => return None,
        };
        let num = |s: &str, p: char| s.strip_prefix(p)?.parse::<u8>().ok();
        Some(MatmulClass { a_transposed, b_transposed, b_16bit, m_bucket: num(m, 'm')?, n_bucket: num(n, 'n')?, k_bucket: num(k, 'k')? })
    }

    /// How far apart two classes of the same layouts are (None across layouts or B storage).
    fn distance(&self, other: &MatmulClass) -> Option<u32> {
        let same = (self.a_transposed, self.b_transposed, self.b_16bit) == (other.a_transposed, other.b_transposed, other.b_16bit);
        let d = |a: u8, b: u8| (a as i32 - b as i32).unsigned_abs();
        same.then(|| d(self.m_bucket, other.m_bucket) + d(self.n_bucket, other.n_bucket) + d(self.k_bucket, other.k_bucket))
    }
}

/// Where the variants of a device's table came from.
#[derive(Clone, Debug, PartialEq)]
pub enum TableSource {
    /// `zerostream tune`'s file for this adapter, driver and version.
    Tuned { path: PathBuf, created: String },
    /// No file: the built-in default for the adapter's vendor.
    Builtin { vendor: &'static str },
}

/// The variant per shape class for one adapter.
#[derive(Clone, Debug)]
pub struct MatmulTable {
    pub source: TableSource,
    /// For products of no tuned class nearby.
    pub default: MatmulTile,
    pub entries: BTreeMap<MatmulClass, MatmulTile>,
    /// The cooperative-matrix variant per class (any class it does not name runs
    /// [`Self::coop_default_for`] the adapter's cooperative size).
    pub coop_entries: BTreeMap<MatmulClass, CoopTile>,
    /// The vendor's measured cooperative-matrix default ([`builtin_coop_default`]), at its size.
    pub coop_default: Option<CoopTile>,
    /// Where the upload ring stages writes: as tuned, else wgpu's mapped buffers.
    pub upload_staging: UploadStaging,
    /// Where read-backs land: as tuned, else wgpu's mapped buffers.
    pub read_back: ReadBack,
}

/// `class`'s own entry, else the nearest of the same layouts within [`MAX_BORROW_DISTANCE`], among the
/// entries `usable` accepts.
fn nearest<V: Copy>(entries: &BTreeMap<MatmulClass, V>, class: &MatmulClass, usable: impl Fn(&V) -> bool) -> Option<V> {
    entries
        .iter()
        .filter(|(_, v)| usable(v))
        .filter_map(|(c, v)| class.distance(c).filter(|d| *d <= MAX_BORROW_DISTANCE).map(|d| (d, *v)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Classes further apart than this (in half-octaves, summed over M, N, K) are not borrowed from.
const MAX_BORROW_DISTANCE: u32 = 2;

impl MatmulTable {
    /// The built-in default for an adapter nobody tuned: the vendor's, where one was measured.
    pub fn builtin(adapter: &AdapterSummary) -> Self {
        let (vendor, default) = builtin_default(adapter);
        let (entries, coop_entries, coop_default) = (BTreeMap::new(), BTreeMap::new(), builtin_coop_default(adapter));
        let (upload_staging, read_back) = (UploadStaging::Mapped, ReadBack::Mapped);
        MatmulTable { source: TableSource::Builtin { vendor }, default, entries, coop_entries, coop_default, upload_staging, read_back }
    }

    /// The variant for a product of class `class`: its own tuned entry, else the nearest tuned class of
    /// the same layouts within [`MAX_BORROW_DISTANCE`], else the default.
    pub fn choose(&self, class: &MatmulClass) -> MatmulTile {
        nearest(&self.entries, class, |_| true).unwrap_or(self.default)
    }

    /// The cooperative-matrix variant of cooperative size `coop` for a product of class `class`: as
    /// [`Self::choose`], else [`Self::coop_default_for`] that size.
    pub fn choose_coop(&self, class: &MatmulClass, coop: u32) -> CoopTile {
        nearest(&self.coop_entries, class, |t| t.coop == coop).unwrap_or(self.coop_default_for(coop))
    }

    /// The cooperative-matrix variant of size `coop` for classes nobody tuned: the vendor's measured one
    /// where it is of that size, else the kernel as it was before variants.
    pub fn coop_default_for(&self, coop: u32) -> CoopTile {
        self.coop_default.filter(|t| t.coop == coop).unwrap_or(CoopTile::default_for(coop))
    }

    /// One line for `zerostream devices` and the run's description.
    pub fn describe(&self) -> String {
        match &self.source {
            TableSource::Tuned { path, created } => {
                let coop = match self.coop_entries.len() {
                    0 => String::new(),
                    n => format!(", {n} cooperative-matrix classes"),
                };
                format!("tuned table {} ({} shape classes{coop}, {created}; default {})", path.display(), self.entries.len(), self.default)
            }
            TableSource::Builtin { vendor } => {
                format!("built-in default for {vendor}: {} (not tuned here: run `zerostream tune`)", self.default)
            }
        }
    }

    /// The table for `adapter`: its tuned file if there is one for this driver and version, else the
    /// built-in default. A file that cannot be read or is not a table is reported in the second value
    /// (and not used): a cache must never stop a run.
    pub fn load(adapter: &AdapterSummary) -> (Self, Option<String>) {
        let Some(path) = existing_table(adapter) else { return (Self::builtin(adapter), tune_dir_problem()) };
        match Self::read(&path, adapter) {
            Ok(table) => (table, None),
            Err(e) => (Self::builtin(adapter), Some(format!("ignoring the matmul tuning table {}: {e:#}", path.display()))),
        }
    }

    fn read(path: &Path, adapter: &AdapterSummary) -> Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let file: TableFile = serde_json::from_str(&text).context("not a zerostream tuning table")?;
        Self::from_file(file, path, adapter)
    }

    /// The table `file` (read from, or written to, `path`) holds, if it was tuned for `adapter`, with
    /// the vendor's cooperative-matrix default for the classes it does not name.
    pub(crate) fn from_file(file: TableFile, path: &Path, adapter: &AdapterSummary) -> Result<Self> {
        let key = TableKey::of(adapter);
        if file.key != key {
            bail!("it was tuned for {:?}, not {:?}", file.key, key);
        }
        let default = MatmulTile::parse(&file.default).map_err(anyhow::Error::msg)?;
        let mut entries = BTreeMap::new();
        for e in &file.entries {
            let class = MatmulClass::parse(&e.class).with_context(|| format!("shape class {:?}", e.class))?;
            entries.insert(class, MatmulTile::parse(&e.variant).map_err(anyhow::Error::msg)?);
        }
        let mut coop_entries = BTreeMap::new();
        for e in &file.coop {
            let class = MatmulClass::parse(&e.class).with_context(|| format!("shape class {:?}", e.class))?;
            coop_entries.insert(class, CoopTile::parse(&e.variant).map_err(anyhow::Error::msg)?);
        }
        let upload_staging = match &file.upload {
            None => UploadStaging::Mapped,
            Some(u) => UploadStaging::parse(&u.staging).with_context(|| format!("upload staging {:?}: not mapped or host", u.staging))?,
        };
        let read_back = match &file.download {
            None => ReadBack::Mapped,
            Some(d) => ReadBack::parse(&d.read_back).with_context(|| format!("read-back {:?}: not mapped or pinned", d.read_back))?,
        };
        let source = TableSource::Tuned { path: path.to_path_buf(), created: file.created };
        let coop_default = builtin_coop_default(adapter);
        Ok(MatmulTable { source, default, entries, coop_entries, coop_default, upload_staging, read_back })
    }
}

/// What a table was tuned on: a table is used only on the same adapter, driver and zerostream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableKey {
    pub adapter: String,
    pub backend: String,
    pub driver: String,
    pub zerostream: String,
}

impl TableKey {
    pub fn of(adapter: &AdapterSummary) -> Self {
        TableKey {
            adapter: adapter.name.clone(),
            backend: adapter.backend.clone(),
            driver: adapter.driver.clone(),
            zerostream: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// One tuned class in the file, with what the tuner measured (for people; the device reads class and
/// variant).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableEntry {
    pub class: String,
    pub variant: String,
    /// The product the class was timed on, e.g. `M=4096 N=2304 K=768`, and which products those were.
    pub shape: String,
    pub products: Vec<String>,
    pub seconds: f64,
    pub default_seconds: f64,
}

/// The tuning file: `<cache>/zerostream/tune/<adapter>-<hash>.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableFile {
    pub key: TableKey,
    pub created: String,
    pub default: String,
    pub entries: Vec<TableEntry>,
    /// The attention kernels' classes (`attention_tuning.rs`): absent from files written before they
    /// were tuned, which therefore still load.
    #[serde(default)]
    pub attention: Vec<TableEntry>,
    /// The cooperative-matrix matmul's classes (`--matmul-inputs f16`), on adapters that have them;
    /// absent from older files.
    #[serde(default)]
    pub coop: Vec<TableEntry>,
    /// The upload ring's staging as timed (absent from older files, and from tunes of adapters never
    /// timed: those stage in mapped buffers).
    #[serde(default)]
    pub upload: Option<UploadEntry>,
    /// Where read-backs land as timed (absent from older files and untimed adapters: mapped buffers).
    #[serde(default)]
    pub download: Option<DownloadEntry>,
}

/// The upload ring's staging `zerostream tune` chose ([`UploadStaging`]'s name), with what it measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UploadEntry {
    pub staging: String,
    /// Bytes per timed write, and the best GB/s through each kind (host: None where unavailable).
    pub bytes: u64,
    pub mapped_gbps: f64,
    pub host_gbps: Option<f64>,
}

/// Where `zerostream tune` chose to land read-backs ([`ReadBack`]'s name), with what it measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DownloadEntry {
    pub read_back: String,
    /// Bytes per timed read, and the best GB/s into each kind (pinned: None where unavailable).
    pub bytes: u64,
    pub mapped_gbps: f64,
    pub pinned_gbps: Option<f64>,
}

impl TableFile {
    /// A table of `entries`, `attention` and `coop` for `adapter`, created `created`: every class it
    /// does not name keeps the vendor's built-in default, as on an adapter never tuned.
    pub fn for_adapter(
        adapter: &AdapterSummary,
        created: String,
        entries: Vec<TableEntry>,
        attention: Vec<TableEntry>,
        coop: Vec<TableEntry>,
    ) -> Self {
        let default = MatmulTable::builtin(adapter).default.name();
        TableFile { key: TableKey::of(adapter), created, default, entries, attention, coop, upload: None, download: None }
    }

    /// Writes the table beside its final name and renames it into place, so a reader never sees half a
    /// file and an interrupted tune leaves the previous table.
    pub fn save(&self, path: &Path) -> Result<()> {
        let dir = path.parent().context("a tuning table path has a directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let partial = path.with_extension("json.partial");
        std::fs::write(&partial, serde_json::to_string_pretty(self)? + "\n").with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, path).with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
        Ok(())
    }
}

/// The directory of tuning tables: `$ZEROSTREAM_TUNE_DIR`, else the user's cache directory
/// (`~/.cache/zerostream/tune` on Linux, `~/Library/Caches/...` on macOS, `%LOCALAPPDATA%` on Windows).
pub fn tune_dir() -> Option<PathBuf> {
    match std::env::var_os(TUNE_DIR_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::cache_dir().map(|d| d.join("zerostream").join("tune")),
    }
}

/// Why no table can be read from the tuning directory at all, if it names something other than a
/// directory (`ZEROSTREAM_TUNE_DIR` set to a file): said beside "not tuned here", which alone would hide it.
pub fn tune_dir_problem() -> Option<String> {
    let dir = tune_dir()?;
    let from = if std::env::var_os(TUNE_DIR_ENV).is_some_and(|d| !d.is_empty()) { format!("{TUNE_DIR_ENV}=") } else { String::new() };
    (dir.exists() && !dir.is_dir()).then(|| format!("{from}{} is not a directory: no tuning table is read from it", dir.display()))
}

/// Where `adapter`'s table lives: a readable stem from its name and a hash of the whole key (driver
/// and version included), so a driver update starts untuned rather than with stale winners.
pub fn table_path(adapter: &AdapterSummary) -> Option<PathBuf> {
    let key = TableKey::of(adapter);
    let stem: String = key.adapter.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(48).collect();
    // FNV-1a over the key's fields: stable across runs and platforms (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in [&key.adapter, &key.backend, &key.driver, &key.zerostream].iter().flat_map(|s| s.bytes().chain([0])) {
        hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
    }
    Some(tune_dir()?.join(format!("{stem}-{hash:016x}.json")))
}

/// The table file to load for `adapter`, if any: the one at [`table_path`], else (a table copied in
/// from another machine under another name) the first in the tuning directory, by name, whose key is
/// this adapter's.
pub fn existing_table(adapter: &AdapterSummary) -> Option<PathBuf> {
    let own = table_path(adapter)?;
    if own.exists() {
        return Some(own);
    }
    let key = TableKey::of(adapter);
    let mut files: Vec<PathBuf> = std::fs::read_dir(own.parent()?).ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
    files.sort();
    files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")).find(|p| {
        // A file that is not a table, or another adapter's, is passed over here; only the own one is reported.
        let text = std::fs::read_to_string(p).unwrap_or_default();
        serde_json::from_str::<TableFile>(&text).is_ok_and(|f| f.key == key)
    })
}

/// The vendor's default variant and the vendor's name. Only measured choices go here; an adapter of a
/// vendor nobody measured runs the kernel as it was before variants.
fn builtin_default(adapter: &AdapterSummary) -> (&'static str, MatmulTile) {
    let vendor = match adapter.vendor {
        0x10de => "NVIDIA",
        0x1002 => "AMD",
        0x8086 => "Intel",
        0x106b => "Apple",
        0x10005 => "Mesa (software)",
        _ if adapter.device_type == wgpu::DeviceType::Cpu => "a software adapter",
        _ => "an unknown vendor",
    };
    let default = match adapter.vendor {
        // `zerostream tune` on an H100 (benches/results/2026-11-26-h100-tune-table.json): this variant won
        // 44 of the 70 GPT-2 and Llama shape classes, up to 2.2x faster than `MatmulTile::DEFAULT` there;
        // 128 x 128 tiles won 25 of the other 26, most of them Llama-3.2-1B classes.
        0x10de => MatmulTile { tile_m: 64, tile_n: 64, tile_k: 16, thread_m: 4, thread_n: 4, ..MatmulTile::DEFAULT },
        _ => MatmulTile::DEFAULT,
    };
    (vendor, default)
}

/// The vendor's cooperative-matrix variant for classes nobody tuned. Only measured choices go here.
pub(crate) fn builtin_coop_default(adapter: &AdapterSummary) -> Option<CoopTile> {
    match adapter.vendor {
        // `zerostream tune` on an H200 (benches/results/2026-11-27-h200-gpu-wide.md): this wide variant won
        // 23 of the 32 cooperative-matrix classes it reached (GPT-2 124M and 1.5B; another wide one 6, and
        // the other 3 were products then too large to pack), 5-15x faster than the staged default and
        // 1.5-3x faster than the direct variants there.
        0x10de => {
            Some(CoopTile { loads: zerostream_shaders::Loads::Wide, frag_m: 4, frag_n: 4, workgroup: 128, ..CoopTile::default_for(16) })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
