//! The learning-rate schedule and the dynamic loss scale (fp16 training, f16 matmul inputs).

/// `--lr-schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LrSchedule {
    /// The peak rate after warm-up, to the end.
    Constant,
    /// Half a cosine from the peak rate down to `--min-lr` at the last step.
    Cosine,
}

/// The learning rate of each optimizer step.
#[derive(Clone, Copy, Debug)]
pub struct LrPlan {
    /// `--lr`: the rate after warm-up.
    pub peak: f64,
    /// `--min-lr`: where the cosine ends.
    pub min: f64,
    /// `--warmup-steps`: steps of the linear warm-up.
    pub warmup_steps: u64,
    /// The step count the cosine spans: `--steps` on the command line. A library caller sets it with
    /// `TrainConfig::steps` (a shorter span holds `min` from its end on; a longer one stops the run
    /// part-way down the curve).
    pub total_steps: u64,
    pub schedule: LrSchedule,
}

impl LrPlan {
    /// The rate of step `s` (from 0): linear warm-up `peak * (s+1) / warmup`, then the schedule.
    pub fn at(&self, s: u64) -> f64 {
        if s < self.warmup_steps {
            return self.peak * (s + 1) as f64 / self.warmup_steps as f64;
        }
        match self.schedule {
            LrSchedule::Constant => self.peak,
            LrSchedule::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).saturating_sub(1).max(1);
                let progress = ((s - self.warmup_steps) as f64 / span as f64).min(1.0);
                self.min + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (self.peak - self.min)
            }
        }
    }
}

/// The loss scaler's state (the dynamic scale with `TrainConfig::loss_scaled`; 1 and never changing otherwise).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ScalerState {
    pub scale: f32,
    pub clean_steps: u32,
    pub growth_interval: u32,
}

/// Dynamic loss scaling for 16-bit values (fp16 gradients, f16 matmul inputs; see
/// [`super::TrainConfig::loss_scaled`]): multiply the loss by `scale` so small gradients survive in 16
/// bits; on overflow skip the step and halve the scale; after `growth_interval` clean steps, double it.
#[derive(Clone, Debug)]
pub struct LossScaler {
    pub scale: f32,
    clean_steps: u32,
    growth_interval: u32,
}

/// The largest finite f16: a gradient above it would overflow in 16-bit storage.
pub const F16_MAX: f32 = 65504.0;

impl LossScaler {
    /// PyTorch's GradScaler defaults: 2^16, doubling after 2000 clean steps.
    pub fn new() -> Self {
        LossScaler { scale: 65536.0, clean_steps: 0, growth_interval: 2000 }
    }
    /// A scale that never changes (1 for fp32 and bf16).
    pub fn fixed_one() -> Self {
        LossScaler { scale: 1.0, clean_steps: 0, growth_interval: u32::MAX }
    }
    /// Whether this is [`Self::fixed_one`]'s scale, which never changes.
    pub fn is_fixed(&self) -> bool {
        self.growth_interval == u32::MAX
    }
    /// The scaler's state, for a checkpoint.
    pub fn state(&self) -> ScalerState {
        ScalerState { scale: self.scale, clean_steps: self.clean_steps, growth_interval: self.growth_interval }
    }
    /// The scaler a checkpoint recorded.
    pub fn restore(s: &ScalerState) -> Self {
        LossScaler { scale: s.scale, clean_steps: s.clean_steps, growth_interval: s.growth_interval }
    }
    /// Records whether the step overflowed; returns whether to apply it.
    pub fn update(&mut self, overflowed: bool) -> bool {
        if overflowed {
            self.scale = (self.scale * 0.5).max(1.0);
            self.clean_steps = 0;
            return false;
        }
        self.clean_steps += 1;
        if self.clean_steps >= self.growth_interval {
            self.scale *= 2.0;
            self.clean_steps = 0;
        }
        true
    }
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_reaches_min_at_the_last_step() {
        let plan = LrPlan { peak: 1e-3, min: 1e-4, warmup_steps: 10, total_steps: 110, schedule: LrSchedule::Cosine };
        assert!((plan.at(0) - 1e-4).abs() < 1e-12);
        assert!((plan.at(9) - 1e-3).abs() < 1e-12);
        assert!((plan.at(10) - 1e-3).abs() < 1e-12);
        assert!((plan.at(109) - 1e-4).abs() < 1e-12);
        assert!(plan.at(60) < 1e-3 && plan.at(60) > 1e-4);
        let constant = LrPlan { schedule: LrSchedule::Constant, warmup_steps: 0, ..plan };
        assert_eq!(constant.at(0), 1e-3);
        assert_eq!(constant.at(109), 1e-3);
    }

    #[test]
    fn overflow_halves_and_skips_and_clean_windows_double() {
        let mut s = LossScaler { scale: 1024.0, clean_steps: 0, growth_interval: 3 };
        assert!(!s.update(true));
        assert_eq!(s.scale, 512.0);
        assert!(s.update(false) && s.update(false));
        assert_eq!(s.scale, 512.0);
        assert!(s.update(false));
        assert_eq!(s.scale, 1024.0);
    }
}
