//! How messages write counts, sizes and durations: "1 step", "2 steps", never "1 steps" or "step(s)";
//! "512 B", "3.5 MiB", never "0.0 MiB", or exactly as a flag takes them ("256MiB"); "0.42 s",
//! "12 min 5 s". And the one refusal of a zero where a flag needs a count ([`require_positive`]:
//! "--seq-len 0: must be at least 1").

/// `n` and the noun, plural unless `n` is 1 (`-es` after s, x, ch and sh: "micro-batches").
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    let es = ["s", "x", "ch", "sh"].iter().any(|end| noun.ends_with(end));
    match n {
        1 => format!("1 {noun}"),
        _ if es => format!("{n} {noun}es"),
        _ => format!("{n} {noun}s"),
    }
}

/// `bytes` in the largest binary unit that leaves at least 1 of it, one decimal (whole bytes below 1 KiB).
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "B" { format!("{bytes} B") } else { format!("{value:.1} {unit}") }
}

/// `bytes` exactly, in the largest binary unit that divides it, as a flag takes it: "256MiB", "1536B".
pub fn exact_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// A duration for people: "0 s", "0.42 s", "3.1 s", "95 s", "12 min 5 s", "2 h 3 min".
pub fn seconds(s: f64) -> String {
    match s {
        0.0 => "0 s".to_string(),
        s if s < 1.0 => format!("{s:.2} s"),
        s if s < 10.0 => format!("{s:.1} s"),
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{} min {} s", (s / 60.0) as u64, s as u64 % 60),
        s => format!("{} h {} min", (s / 3600.0) as u64, s as u64 % 3600 / 60),
    }
}

/// Refuses the first of `flags` (name, value) that is 0, by name: "--seq-len 0: must be at least 1".
pub fn require_positive(flags: &[(&str, usize)]) -> anyhow::Result<()> {
    match flags.iter().find(|(_, v)| *v == 0) {
        Some((flag, _)) => anyhow::bail!("{flag} 0: must be at least 1"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(super::counted(1u64, "step"), "1 step");
        assert_eq!(super::counted(0u64, "rank"), "0 ranks");
        assert_eq!(super::counted(3u32, "adapter"), "3 adapters");
        assert_eq!(super::counted(4u32, "micro-batch"), "4 micro-batches");
        assert_eq!(super::counted(1u32, "micro-batch"), "1 micro-batch");
    }

    #[test]
    fn the_zero_flag_is_named() {
        assert!(super::require_positive(&[("--a", 1), ("--b", 2)]).is_ok());
        assert_eq!(super::require_positive(&[("--a", 1), ("--b", 0)]).unwrap_err().to_string(), "--b 0: must be at least 1");
    }

    #[test]
    fn sizes_take_the_unit_that_shows_them() {
        assert_eq!(super::size(1), "1 B");
        assert_eq!(super::size(1023), "1023 B");
        assert_eq!(super::size(1536), "1.5 KiB");
        assert_eq!(super::size(3 << 20 | 1 << 19), "3.5 MiB");
        assert_eq!(super::size(5 << 30), "5.0 GiB");
        assert_eq!(super::exact_size(256 << 20), "256MiB");
        assert_eq!(super::exact_size(1536), "1536B");
        assert_eq!(super::exact_size(3 << 40), "3TiB");
    }

    #[test]
    fn durations_take_the_unit_that_shows_them() {
        assert_eq!(super::seconds(0.0), "0 s");
        assert_eq!(super::seconds(0.123), "0.12 s");
        assert_eq!(super::seconds(3.07), "3.1 s");
        assert_eq!(super::seconds(95.4), "95 s");
        assert_eq!(super::seconds(725.0), "12 min 5 s");
        assert_eq!(super::seconds(7380.0), "2 h 3 min");
    }
}
