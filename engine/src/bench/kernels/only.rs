//! `bench kernels --only`: which kernels' families run and which of their rows are timed.

use anyhow::{Result, bail};

/// The kernels `bench kernels` times, by the names `--only` matches (a part of one names it).
pub const KERNELS: &[&str] = &[
    "matmul",
    "matmul_coop_mma",
    "attention",
    "layernorm",
    "gelu",
    "residual",
    "bias_backward",
    "encoder",
    "crossentropy",
    "crossentropy_chunk_stats",
    "crossentropy_chunk_grad",
    "axpy",
    "fill",
    "cast",
];

/// Every row's kernel name, each beginning with its family's (`KERNELS`): what `--only` may name besides
/// the families (the tests hold every row to this list).
pub const ROWS: &[&str] = &[
    "matmul",
    "matmul_coop_mma",
    "attention_forward",
    "attention_backward",
    "layernorm_forward",
    "layernorm_backward",
    "gelu_forward",
    "gelu_backward",
    "residual_forward",
    "bias_backward",
    "encoder_forward",
    "encoder_backward",
    "crossentropy",
    "crossentropy_chunk_stats",
    "crossentropy_chunk_grad",
    "axpy",
    "fill",
    "cast_f32_to_f16",
    "cast_half_to_f32",
];

/// The family `row` belongs to: the longest family name it begins with (`crossentropy_chunk_grad`
/// is a family of its own, not `crossentropy`'s).
fn family_of(row: &str) -> Option<&'static str> {
    KERNELS.iter().copied().filter(|k| row.starts_with(k)).max_by_key(|k| k.len())
}

/// Whether row `row` is timed under `--only`: it contains one of its words (a family's name or part
/// of it keeps every row of the family, since a row's name begins with its family's).
pub(super) fn keeps_row(only: &[String], row: &str) -> bool {
    only.is_empty() || only.iter().any(|o| row.contains(o.as_str()))
}

/// Whether kernel `family` runs under `--only`: some row of it is timed.
pub(super) fn wants_family(only: &[String], family: &str) -> bool {
    only.is_empty() || ROWS.iter().any(|r| family_of(r) == Some(family) && keeps_row(only, r))
}

/// Refuses a word of `--only` that no row's name contains, listing the kernels.
pub(super) fn check(only: &[String]) -> Result<()> {
    if let Some(o) = only.iter().find(|o| !ROWS.iter().any(|r| r.contains(o.as_str()))) {
        bail!("--only {o:?} matches no kernel (the kernels: {}, and their rows' names, such as gelu_backward)", KERNELS.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_times_the_rows_it_names_and_runs_their_families() {
        let only = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert!(check(&only(&["gelu_backward", "cross", "backward"])).is_ok());
        assert!(check(&only(&["matmull"])).is_err() && check(&only(&["gelu_bogus"])).is_err());
        let grad = only(&["crossentropy_chunk_grad"]);
        assert!(wants_family(&grad, "crossentropy_chunk_grad") && !wants_family(&grad, "crossentropy"));
        let probe = only(&["matmul_coop_mma"]);
        assert!(wants_family(&probe, "matmul_coop_mma") && !wants_family(&probe, "matmul"));
        let backward = only(&["gelu_backward"]);
        assert!(wants_family(&backward, "gelu") && keeps_row(&backward, "gelu_backward") && !keeps_row(&backward, "gelu_forward"));
        for row in ROWS {
            assert!(family_of(row).is_some(), "{row} begins with no family's name");
        }
    }
}
