//! How messages write counts: "1 step", "2 steps", never "1 steps" or "step(s)".

/// `n` and the noun, plural (with an `s`) unless `n` is 1.
pub fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(super::counted(1u64, "step"), "1 step");
        assert_eq!(super::counted(0u64, "rank"), "0 ranks");
        assert_eq!(super::counted(3u32, "adapter"), "3 adapters");
    }
}
