//! Which variant of the training attention kernels ([`AttentionTile`]) the gpu device runs for a call:
//! the sibling of `matmul_tuning.rs`, kept in the same tuning file (its `attention` entries; a file
//! from before attention was tuned has none and still loads), or the default where none was tuned.
//!
//! Calls are grouped into shape classes ([`AttentionClass`]: forward or backward, the head dim, and T
//! in half-octave buckets, as the matmul's M, N and K): the grid's length and each workgroup's work
//! follow T, and a row's registers and staging follow D. Any variant gives the same bits
//! (`shaders/src/attention_template.rs`), so the table only ever changes the speed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_shaders::{AttentionPass, AttentionTile};

use super::adapter::AdapterSummary;
use super::matmul_tuning::{TableFile, TableKey, TableSource, bucket, existing_table};
use crate::ops::attention::AttentionDims;

/// An attention call's shape class: what the tuner times once and the device looks up for every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttentionClass {
    pub pass: AttentionPass,
    pub head_dim: u32,
    /// round(2 log2(T)): half-octave buckets.
    pub t_bucket: u8,
}

impl AttentionClass {
    pub fn of(pass: AttentionPass, d: &AttentionDims) -> Self {
        AttentionClass { pass, head_dim: d.head_dim as u32, t_bucket: bucket(d.seq_len) }
    }

    /// `forward/d64/t20`: the pass, the head dim, T's bucket.
    pub fn key(&self) -> String {
        format!("{}/d{}/t{}", self.pass.name(), self.head_dim, self.t_bucket)
    }

    pub fn parse(key: &str) -> Option<Self> {
        let parts: Vec<&str> = key.split('/').collect();
        let [pass, d, t] = parts[..] else { return None };
        let pass = AttentionPass::parse(pass)?;
        Some(AttentionClass { pass, head_dim: d.strip_prefix('d')?.parse().ok()?, t_bucket: t.strip_prefix('t')?.parse().ok()? })
    }

    /// How far apart two classes of the same pass and head dim are (None otherwise: another D stages
    /// and accumulates another number of chunks).
    fn distance(&self, other: &AttentionClass) -> Option<u32> {
        ((self.pass, self.head_dim) == (other.pass, other.head_dim)).then(|| (self.t_bucket as i32 - other.t_bucket as i32).unsigned_abs())
    }
}

/// Classes further apart than this (in half-octaves of T) are not borrowed from.
const MAX_BORROW_DISTANCE: u32 = 2;

/// The attention variant per shape class for one adapter.
#[derive(Clone, Debug)]
pub struct AttentionTable {
    pub source: TableSource,
    pub entries: BTreeMap<AttentionClass, AttentionTile>,
}

impl AttentionTable {
    /// No tuned classes: every call runs [`AttentionTile::UNTUNED`] (no vendor has measured defaults).
    pub fn builtin(adapter: &AdapterSummary) -> Self {
        let vendor = super::matmul_tuning::MatmulTable::builtin(adapter).source;
        AttentionTable { source: vendor, entries: BTreeMap::new() }
    }

    /// The variant for a call of class `class`: its own tuned entry, else the nearest tuned T of the same
    /// pass and head dim within [`MAX_BORROW_DISTANCE`], else [`AttentionTile::UNTUNED`].
    pub fn choose(&self, class: &AttentionClass) -> AttentionTile {
        if let Some(tile) = self.entries.get(class) {
            return *tile;
        }
        self.entries
            .iter()
            .filter_map(|(c, t)| class.distance(c).filter(|d| *d <= MAX_BORROW_DISTANCE).map(|d| (d, *t)))
            .min_by_key(|(d, _)| *d)
            .map_or(AttentionTile::UNTUNED, |(_, t)| t)
    }

    /// One line for `zerostream devices`: the tuned choices, or the default.
    pub fn describe(&self) -> String {
        if self.entries.is_empty() {
            return format!("{} for every shape (not tuned here: run `zerostream tune`)", AttentionTile::UNTUNED);
        }
        let chosen: Vec<String> = self.entries.iter().map(|(c, t)| format!("{} {t}", c.key())).collect();
        format!("tuned: {}; {} elsewhere", chosen.join(", "), AttentionTile::UNTUNED)
    }

    /// The table for `adapter` from its tuning file (the same file as the matmul's), else the default.
    /// A file that cannot be read, or whose attention entries are not valid, is reported in the second
    /// value and not used.
    pub fn load(adapter: &AdapterSummary) -> (Self, Option<String>) {
        let Some(path) = existing_table(adapter) else { return (Self::builtin(adapter), None) };
        match Self::read(&path, adapter) {
            Ok(table) => (table, None),
            Err(e) => (Self::builtin(adapter), Some(format!("ignoring the attention tuning table {}: {e:#}", path.display()))),
        }
    }

    fn read(path: &Path, adapter: &AdapterSummary) -> Result<Self> {
        let file: TableFile = serde_json::from_str(&std::fs::read_to_string(path)?).context("not a zerostream tuning table")?;
        let key = TableKey::of(adapter);
        if file.key != key {
            bail!("it was tuned for {:?}, not {:?}", file.key, key);
        }
        Ok(AttentionTable {
            source: TableSource::Tuned { path: path.to_path_buf(), created: file.created.clone() },
            entries: entries(&file)?,
        })
    }
}

/// The attention entries of a tuning file, by class.
pub fn entries(file: &TableFile) -> Result<BTreeMap<AttentionClass, AttentionTile>> {
    let mut entries = BTreeMap::new();
    for e in &file.attention {
        let class = AttentionClass::parse(&e.class).with_context(|| format!("attention shape class {:?}", e.class))?;
        entries.insert(class, AttentionTile::parse(&e.variant).map_err(anyhow::Error::msg)?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_name_pass_head_dim_and_bucket_reversibly() {
        let c = AttentionClass::of(AttentionPass::Backward, &AttentionDims::gqa(4, 1024, 32, 8, 64));
        assert_eq!(c.key(), "backward/d64/t20");
        assert_eq!(AttentionClass::parse(&c.key()), Some(c));
        for bad in ["sideways/d64/t20", "forward/64/t20", "forward/d64", "forward/d64/tx"] {
            assert_eq!(AttentionClass::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn choose_prefers_own_then_near_then_default() {
        let own = AttentionClass::parse("forward/d64/t20").unwrap();
        let near = AttentionClass::parse("forward/d64/t18").unwrap();
        let far = AttentionClass::parse("forward/d64/t14").unwrap();
        let other_d = AttentionClass::parse("forward/d128/t20").unwrap();
        let other_pass = AttentionClass::parse("backward/d64/t20").unwrap();
        let small = AttentionTile::rows(8);
        let table = AttentionTable { source: TableSource::Builtin { vendor: "test" }, entries: BTreeMap::from([(own, small)]) };
        assert_eq!(table.choose(&own), small);
        assert_eq!(table.choose(&near), small);
        for class in [far, other_d, other_pass] {
            assert_eq!(table.choose(&class), AttentionTile::UNTUNED, "{}", class.key());
        }
        assert!(table.describe().contains("forward/d64/t20 rows8"), "{}", table.describe());
    }

    /// A tuning file written before attention was tuned (no `attention` key) still loads, with no
    /// attention entries; a file with them reads them.
    #[test]
    fn files_without_attention_entries_still_load() {
        let old = r#"{"key": {"adapter": "a", "backend": "b", "driver": "c", "zerostream": "d"}, "created": "now",
            "default": "128x128x8/8x8/db/v4", "entries": []}"#;
        let file: TableFile = serde_json::from_str(old).unwrap();
        assert!(file.attention.is_empty() && entries(&file).unwrap().is_empty());
        let new = old.replace(
            r#""entries": []"#,
            r#""entries": [], "attention": [{"class": "forward/d64/t12", "variant": "rows16", "shape": "", "products": [],
                "seconds": 1.0, "default_seconds": 2.0}]"#,
        );
        let file: TableFile = serde_json::from_str(&new).unwrap();
        let read = entries(&file).unwrap();
        assert_eq!(read.get(&AttentionClass::parse("forward/d64/t12").unwrap()), Some(&AttentionTile::rows(16)));
        let bad = new.replace("rows16", "rows99");
        assert!(entries(&serde_json::from_str(&bad).unwrap()).unwrap_err().to_string().contains("rows99"));
        let blocked = serde_json::from_str(&new.replace("rows16", "rows32x4")).unwrap();
        assert_eq!(entries(&blocked).unwrap().into_values().collect::<Vec<_>>(), [AttentionTile::blocked(32)]);
    }
}
