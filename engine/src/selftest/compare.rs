//! One check's verdict: a device's outputs compared with the twin's, element by element, within
//! `atol + rtol * |ref|` or bit for bit, summed up per kernel ([`CheckResult`]) and said in words.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How close a device's result must be to the twin's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// |got - want| <= atol + rtol * |want| for every element.
    Close { atol: f32, rtol: f32 },
    /// The same bits (the contract of the casts and the dropout masks).
    Bits,
}

impl Tolerance {
    pub const fn close(atol: f32, rtol: f32) -> Self {
        Tolerance::Close { atol, rtol }
    }

    /// How far `want` may be missed.
    fn allowed(self, want: f32) -> f32 {
        match self {
            Tolerance::Close { atol, rtol } => atol + rtol * want.abs(),
            Tolerance::Bits => 0.0,
        }
    }

    fn accepts(self, got: f32, want: f32) -> bool {
        match self {
            Tolerance::Bits => got.to_bits() == want.to_bits(),
            // Equal values pass (infinities included); NaN never equals anything but itself.
            Tolerance::Close { .. } => got == want || (got.is_nan() && want.is_nan()) || (got - want).abs() <= self.allowed(want),
        }
    }
}

impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tolerance::Close { atol, rtol } => write!(f, "{atol:e} + {rtol:e}|ref|"),
            Tolerance::Bits => write!(f, "bit for bit"),
        }
    }
}

/// One element of one case: where a device's output is furthest from the twin's.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The case, in words ("64x65x17 A^T accumulate").
    pub case: String,
    /// The element's index in that case's output (`usize::MAX`: the lengths differ).
    pub index: usize,
    pub got: f32,
    pub want: f32,
    /// |got - want| (infinite when one is not finite and they differ).
    pub err: f32,
    /// What the tolerance allows at `want`.
    pub allowed: f32,
}

impl Mismatch {
    /// "case "lse B2 T7 H4 G2 D64" [13]: got 1.5, want 1.25 (|err| 2.5e-1, allowed 1.3e-4)".
    pub fn describe(&self) -> String {
        if self.index == usize::MAX {
            return format!("case \"{}\": {} elements, the twin has {}", self.case, self.got, self.want);
        }
        format!(
            "case \"{}\" [{}]: got {:e}, want {:e} (|err| {:.1e}, allowed {:.1e})",
            self.case, self.index, self.got, self.want, self.err, self.allowed
        )
    }
}

/// The verdict on one kernel (or one variant of it) over all its cases.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckResult {
    /// The kernel or op checked: "matmul", "attention_backward", "cast_f32_to_f16".
    pub kernel: String,
    pub tolerance: Tolerance,
    /// Outputs compared (each a named case: one shape, layout or tensor).
    pub cases: usize,
    /// Cases with at least one element outside the tolerance.
    pub failed_cases: usize,
    /// The largest |got - want| of any element of any case.
    pub max_abs_err: f32,
    /// The element closest to (or furthest past) its tolerance: a failing one when any failed.
    pub worst: Option<Mismatch>,
    /// The device's error, a panic, or a refusal: the check failed whatever the numbers say.
    pub error: Option<String>,
    /// What a passing check says instead of its numbers (the compile check: kernels and entry points).
    pub note: Option<String>,
    /// Seconds the check took (device work, read-backs and the twin).
    pub seconds: f64,
}

impl CheckResult {
    /// A check that could not compare anything: `error` says why.
    pub fn failed(kernel: &str, error: String) -> Self {
        CheckResult {
            kernel: kernel.to_string(),
            tolerance: Tolerance::Bits,
            cases: 0,
            failed_cases: 0,
            max_abs_err: 0.0,
            worst: None,
            error: Some(error),
            note: None,
            seconds: 0.0,
        }
    }

    pub fn passed(&self) -> bool {
        self.error.is_none() && self.failed_cases == 0 && self.cases > 0
    }

    /// The verdict in words, one line: "PASS  matmul  40 cases, worst |err| 2.1e-6 (tolerance ...)".
    pub fn line(&self) -> String {
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        let mut text = format!("{verdict}  {:<40}", self.kernel);
        if self.failed_cases > 0 {
            text += &format!(" {} of {} cases", self.failed_cases, self.cases);
            if let Some(w) = &self.worst {
                text += &format!(" outside {}: worst at {}", self.tolerance, w.describe());
            }
        } else if let Some(note) = self.note.as_ref().filter(|_| self.error.is_none()) {
            text += &format!(" {note}");
        } else if self.cases > 0 {
            text += &format!(" {} cases, ", self.cases);
            text += &match self.tolerance {
                Tolerance::Bits => "every bit equal".to_string(),
                t if self.max_abs_err == 0.0 => format!("all exact (tolerance {t})"),
                t => {
                    let used = self.worst.as_ref().map_or(0.0, |w| w.err / w.allowed);
                    format!("worst |err| {:.1e}, at most {:.0}% of the tolerance {t}", self.max_abs_err, (used * 100.0).ceil())
                }
            };
        }
        if let Some(e) = &self.error {
            text += &format!(" {e}");
        }
        text + &format!(" [{:.2} s]", self.seconds)
    }

    /// One JSON object (`"kind": "check"`), for `zerostream selftest --json`.
    pub fn to_json(&self) -> serde_json::Value {
        let tolerance = match self.tolerance {
            Tolerance::Close { atol, rtol } => serde_json::json!({ "atol": finite_or_text(atol), "rtol": finite_or_text(rtol) }),
            Tolerance::Bits => serde_json::json!("bits"),
        };
        let worst = self.worst.as_ref().map(|w| {
            let index = (w.index != usize::MAX).then_some(w.index);
            serde_json::json!({ "case": w.case, "index": index, "got": finite_or_text(w.got), "want": finite_or_text(w.want),
                "err": finite_or_text(w.err), "allowed": finite_or_text(w.allowed) })
        });
        serde_json::json!({
            "kind": "check", "kernel": self.kernel, "passed": self.passed(), "cases": self.cases,
            "failed_cases": self.failed_cases, "max_abs_err": finite_or_text(self.max_abs_err), "tolerance": tolerance,
            "worst": worst, "error": self.error, "seconds": self.seconds,
        })
    }
}

/// An f32 as JSON: its shortest decimal (1e-4, not 0.00009999999747378752), and infinities or NaN,
/// which JSON has no number for, as text.
fn finite_or_text(x: f32) -> serde_json::Value {
    match x.to_string().parse::<f64>() {
        Ok(v) if x.is_finite() => serde_json::json!(v),
        _ => serde_json::json!(x.to_string()),
    }
}

/// Builds a [`CheckResult`] case by case.
pub struct Check {
    result: CheckResult,
    started: Instant,
    /// (failed, err / allowed) of `result.worst`: a failing element outranks any passing one.
    worst_key: Option<(bool, f32)>,
}

impl Check {
    pub fn new(kernel: &str, tolerance: Tolerance) -> Self {
        let mut result = CheckResult::failed(kernel, String::new());
        result.error = None;
        result.tolerance = tolerance;
        Check { result, started: Instant::now(), worst_key: None }
    }

    /// Compares one case's output with the twin's.
    pub fn compare(&mut self, case: &str, got: &[f32], want: &[f32]) {
        self.result.cases += 1;
        let tolerance = self.result.tolerance;
        if got.len() != want.len() {
            self.result.failed_cases += 1;
            let (got, want) = (got.len() as f32, want.len() as f32);
            let m = Mismatch { case: case.to_string(), index: usize::MAX, got, want, err: f32::INFINITY, allowed: 0.0 };
            self.offer((true, f32::INFINITY), m);
            return;
        }
        // The case's worst element: the first of the largest (failed, err / allowed).
        let mut worst: Option<((bool, f32), usize, f32)> = None;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = tolerance.accepts(g, w);
            let diff = (g - w).abs();
            let err = match (ok, diff.is_finite()) {
                (_, true) => diff,
                (true, false) => 0.0, // equal infinities, or NaN where the twin has NaN
                (false, false) => f32::INFINITY,
            };
            self.result.max_abs_err = self.result.max_abs_err.max(err);
            let ratio = if err == 0.0 { 0.0 } else { err / tolerance.allowed(w) };
            let key = (!ok, if ratio.is_nan() { f32::INFINITY } else { ratio });
            if worst.is_none_or(|(k, _, _)| key > k) {
                worst = Some((key, i, err));
            }
        }
        let Some((key, i, err)) = worst else { return };
        if key.0 {
            self.result.failed_cases += 1;
        }
        let m = Mismatch { case: case.to_string(), index: i, got: got[i], want: want[i], err, allowed: tolerance.allowed(want[i]) };
        self.offer(key, m);
    }

    fn offer(&mut self, key: (bool, f32), m: Mismatch) {
        if self.worst_key.is_none_or(|k| key > k) {
            self.worst_key = Some(key);
            self.result.worst = Some(m);
        }
    }

    /// Fails the check with the device's words (an error that is not a wrong number).
    pub fn fail(&mut self, error: String) {
        self.result.error = Some(error);
    }

    /// The result, timed from [`Check::new`].
    pub fn finish(mut self) -> CheckResult {
        self.result.seconds = self.started.elapsed().as_secs_f64();
        self.result
    }
}

/// Seeded uniform values in [-scale, scale): the inputs of every check (and of the kernel tests).
pub fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Seeded token ids below `vocab`.
pub fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_perturbed_element_fails_its_case_and_is_named() {
        let want = random(1, 100, 1.0);
        let mut got = want.clone();
        let mut check = Check::new("op", Tolerance::close(1e-5, 1e-5));
        check.compare("exact", &got, &want);
        got[37] += 1e-3;
        check.compare("perturbed", &got, &want);
        let r = check.finish();
        assert!(!r.passed());
        assert_eq!((r.cases, r.failed_cases), (2, 1));
        let w = r.worst.unwrap();
        assert_eq!((w.case.as_str(), w.index), ("perturbed", 37));
        assert!(r.max_abs_err > 9e-4);
    }

    #[test]
    fn bits_tell_signed_zeros_apart_and_close_takes_equal_infinities() {
        let mut bits = Check::new("cast", Tolerance::Bits);
        bits.compare("zeros", &[0.0], &[-0.0]);
        assert!(!bits.finish().passed());
        let mut close = Check::new("op", Tolerance::close(1e-6, 0.0));
        close.compare("inf", &[f32::INFINITY, 1.0], &[f32::INFINITY, 1.0 + 1e-7]);
        let r = close.finish();
        assert!(r.passed(), "{}", r.line());
        let mut nan = Check::new("op", Tolerance::close(1.0, 1.0));
        nan.compare("nan", &[f32::NAN], &[0.0]);
        let r = nan.finish();
        assert!(!r.passed() && r.max_abs_err.is_infinite(), "{}", r.line());
    }

    #[test]
    fn the_json_names_the_worst_case_with_short_numbers() {
        let mut check = Check::new("op", Tolerance::close(1e-4, 1e-5));
        check.compare("fine", &[1.0, 2.0], &[1.0, 2.0]);
        check.compare("off", &[1.0, f32::INFINITY], &[1.0, 2.0]);
        let json = check.finish().to_json();
        assert_eq!((json["kind"].as_str(), json["passed"].as_bool(), json["failed_cases"].as_u64()), (Some("check"), Some(false), Some(1)));
        assert_eq!(json["tolerance"]["atol"].as_f64(), Some(1e-4));
        assert_eq!((json["worst"]["case"].as_str(), json["worst"]["index"].as_u64()), (Some("off"), Some(1)));
        assert_eq!((json["worst"]["got"].as_str(), json["max_abs_err"].as_str()), (Some("inf"), Some("inf")));
    }

    #[test]
    fn lengths_that_differ_fail() {
        let mut check = Check::new("op", Tolerance::close(1.0, 1.0));
        check.compare("short", &[1.0], &[1.0, 2.0]);
        let r = check.finish();
        assert!(!r.passed() && r.line().contains("1 elements, the twin has 2"), "{}", r.line());
    }
}
