//! Which of the fast path's builds (AVX-512, AVX2+FMA, the baseline) this CPU runs, chosen at run time.

/// The instruction set the fast path runs with on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2Fma,
    /// The baseline of the target: SSE2 on x86-64, NEON on aarch64.
    Baseline,
}

impl Isa {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") {
                return Isa::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Isa::Avx2Fma;
            }
        }
        Isa::Baseline
    }
    /// Every build this CPU can run, the baseline first: what tests hold to each other.
    pub fn available() -> Vec<Isa> {
        let mut isas = vec![Isa::Baseline];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            isas.push(Isa::Avx2Fma);
        }
        if Isa::detect() == Isa::Avx512 {
            isas.push(Isa::Avx512);
        }
        isas
    }

    /// Panics unless this CPU has `self` (one of [`Isa::available`]): the optimizers call their
    /// `#[target_feature]` builds only after this check.
    pub fn assert_available(self) {
        assert!(Isa::available().contains(&self), "the {} build needs instructions this CPU lacks", self.name());
    }

    pub fn name(&self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Baseline => {
                if cfg!(target_arch = "aarch64") {
                    "neon"
                } else {
                    "baseline"
                }
            }
        }
    }
}
