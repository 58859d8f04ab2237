//! The one place device bytes are counted: every tensor allocation charges a [`ByteBudget`], and the
//! charge is returned when the tensor is dropped. The peak is what `--gpu-mem-budget` is checked against.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};

#[derive(Debug)]
struct Counters {
    budget_bytes: u64,
    live_bytes: AtomicU64,
    peak_bytes: AtomicU64,
}

/// Counts live and peak bytes against a budget. Cloning shares the counters.
#[derive(Clone, Debug)]
pub struct ByteBudget(Arc<Counters>);

/// Bytes held by one allocation; released on drop.
#[derive(Debug)]
pub struct Charge {
    budget: ByteBudget,
    bytes: u64,
}

/// Live and peak bytes, and the budget they are held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocStats {
    pub live_bytes: u64,
    pub peak_bytes: u64,
    pub budget_bytes: u64,
}

impl ByteBudget {
    pub fn new(budget_bytes: u64) -> Self {
        ByteBudget(Arc::new(Counters { budget_bytes, live_bytes: AtomicU64::new(0), peak_bytes: AtomicU64::new(0) }))
    }

    /// Charges `bytes` for the allocation named `label`, or fails without charging if the budget would be exceeded.
    pub fn charge(&self, bytes: u64, label: &str) -> Result<Charge> {
        let c = &self.0;
        let mut live = c.live_bytes.load(Ordering::Relaxed);
        loop {
            let new_live = live + bytes;
            if new_live > c.budget_bytes {
                bail!(
                    "device memory budget exceeded allocating {label} ({bytes} bytes): {live} bytes live, budget {} bytes",
                    c.budget_bytes
                );
            }
            match c.live_bytes.compare_exchange_weak(live, new_live, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    c.peak_bytes.fetch_max(new_live, Ordering::Relaxed);
                    return Ok(Charge { budget: self.clone(), bytes });
                }
                Err(actual) => live = actual,
            }
        }
    }

    pub fn stats(&self) -> AllocStats {
        AllocStats {
            live_bytes: self.0.live_bytes.load(Ordering::Relaxed),
            peak_bytes: self.0.peak_bytes.load(Ordering::Relaxed),
            budget_bytes: self.0.budget_bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.0.live_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_counted_released_and_held_to_the_budget() {
        let budget = ByteBudget::new(1000);
        let a = budget.charge(600, "a").unwrap();
        let err = budget.charge(500, "b").unwrap_err().to_string();
        assert!(err.contains("b (500 bytes)") && err.contains("600 bytes live"), "{err}");
        drop(a);
        let _c = budget.charge(900, "c").unwrap();
        assert_eq!(budget.stats(), AllocStats { live_bytes: 900, peak_bytes: 900, budget_bytes: 1000 });
    }
}
