//! `zerostream bench ...`: measurements of each link of the offload path, one file per link: [`adam`]
//! (the CPU AdamW), [`transfer`] (host<->device through wgpu), [`io`] (NVMe, against fio), [`comm`]
//! (the collectives between ranks), [`kernels`] (every kernel of a training step on the gpu device) and
//! [`overlap`] (whether copies run under kernels on wgpu's one queue);
//! [`tune`] times the kernels' variants on the adapter and keeps the fastest (`zerostream tune`).
//! This file holds what they share: the single-thread memcpy ceiling and `bench all`'s table of links.

use std::time::Instant;

pub mod adam;
pub mod comm;
pub mod io;
pub mod kernels;
pub mod overlap;
pub mod transfer;
pub mod tune;

/// Single-thread memcpy GB/s over `bytes`: the ceiling of a staging copy on the host side.
pub fn memcpy_gbps(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

/// What a link of `bench all` is measured against.
#[derive(Clone, Debug)]
pub struct Ceiling {
    pub name: String,
    pub gbps: f64,
    /// Why a link can come out above this ceiling (it is a reference measured in the same run, not a
    /// physical bound), printed whenever one does.
    pub exceeded_because: String,
}

/// One row of `bench all`: a link, its GB/s and the ceiling it is held against (none for a row that is
/// itself the ceiling of others).
#[derive(Clone, Debug)]
pub struct LinkRow {
    pub link: String,
    pub gbps: f64,
    pub ceiling: Option<Ceiling>,
}

impl LinkRow {
    /// The link as a fraction of its ceiling, when it has one that was measured.
    pub fn fraction(&self) -> Option<f64> {
        self.ceiling.as_ref().filter(|c| c.gbps.is_finite() && c.gbps > 0.0).map(|c| self.gbps / c.gbps)
    }

    /// The ceiling column: "name (85%)", with the reason when the link is above it.
    pub fn ceiling_text(&self) -> String {
        match (&self.ceiling, self.fraction()) {
            (None, _) => "(a ceiling itself)".to_string(),
            (Some(c), None) => format!("{} (not measured)", c.name),
            (Some(c), Some(f)) if f > 1.0 => format!("{} ({:.0}%: above it, because {})", c.name, 100.0 * f, c.exceeded_because),
            (Some(c), Some(f)) => format!("{} ({:.0}%)", c.name, 100.0 * f),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "link": self.link, "gbps": self.gbps });
        if let Some(c) = &self.ceiling {
            v["ceiling"] = c.name.clone().into();
            v["ceiling_gbps"] = if c.gbps.is_finite() { c.gbps.into() } else { serde_json::Value::Null };
            if let Some(f) = self.fraction() {
                v["fraction_of_ceiling"] = f.into();
                if f > 1.0 {
                    v["above_ceiling_because"] = c.exceeded_because.clone().into();
                }
            }
        }
        v
    }
}

/// `bench all`'s table: each link once, beside its own ceiling.
pub fn links_table(rows: &[LinkRow]) -> String {
    // As wide as the longest link (an adapter's name can be long), so the numbers stay in columns.
    let width = rows.iter().map(|r| r.link.chars().count()).max().unwrap_or(0).max(60);
    let mut out = format!("{:<width$} {:>9} {:>9}  ceiling\n", "link", "GB/s", "ceiling");
    for r in rows {
        let ceiling_gbps = match &r.ceiling {
            None => String::new(),
            Some(c) if c.gbps.is_finite() => format!("{:.2}", c.gbps),
            Some(_) => "-".into(), // not measured (fio not installed)
        };
        out += &format!("{:<width$} {:>9.2} {:>9}  {}\n", r.link, r.gbps, ceiling_gbps, r.ceiling_text());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(link: &str, gbps: f64, ceiling_gbps: f64) -> LinkRow {
        LinkRow {
            link: link.into(),
            gbps,
            ceiling: Some(Ceiling { name: "fio".into(), gbps: ceiling_gbps, exceeded_because: "noise".into() }),
        }
    }

    #[test]
    fn a_link_above_its_ceiling_says_why_and_each_link_is_printed_once() {
        let rows = [
            LinkRow { link: "RAM".into(), gbps: 10.0, ceiling: None },
            row("NVMe read", 1.2, 1.0),
            row("NVMe write", 0.9, 1.0),
            row("h2d", 1.0, f64::NAN),
        ];
        let table = links_table(&rows);
        assert!(table.contains("fio (120%: above it, because noise)"), "{table}");
        assert!(table.contains("fio (90%)") && !table.contains("90%: above"), "{table}");
        assert!(table.contains("(a ceiling itself)") && table.contains("fio (not measured)"), "{table}");
        assert!(!table.contains("NaN"), "an unmeasured ceiling is a dash:\n{table}");
        // A link longer than the column widens it: every row's GB/s ends in the same place.
        let long = [row(&"h2d 256MiB Pinned (a very long adapter name) ".repeat(2), 1.0, 2.0), row("NVMe read", 1.2, 1.0)];
        let wide = links_table(&long);
        let width = long[0].link.len();
        for line in wide.lines().skip(1) {
            assert!(line[width + 1..width + 10].trim().parse::<f64>().is_ok(), "GB/s out of its column:\n{wide}");
        }
        for r in &rows {
            assert_eq!(table.matches(&format!("{} ", r.link)).count(), 1, "{} printed more than once:\n{table}", r.link);
        }
        assert_eq!(rows[1].to_json()["above_ceiling_because"], "noise");
        assert!(rows[2].to_json().get("above_ceiling_because").is_none());
    }
}
