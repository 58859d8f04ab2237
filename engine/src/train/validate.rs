//! Validation loss during training: the mean loss of the first K micro-batches of a held-out token file
//! (the training contract's order, so it is the number `zerostream eval` gives for the same weights),
//! computed with the weights as they stand before the next update, through the trainer's own device
//! slots and under its budget — the same streaming machinery as a training step, forward only.

use anyhow::{Result, bail};
use zerostream_checkpoints::TokenFile;

use super::{Clock, Trainer};
use crate::device::Backend;

impl<D: Backend> Trainer<'_, D> {
    /// Mean loss over micro-batches `0..batches` of `data` (B x T of the training run). Every rank
    /// computes all of them (the same uploads and collectives in the same order) and gets the same
    /// number. A block uploaded here stays in its slot for the coming step's forward: the weights are
    /// the same. More micro-batches than `data` holds are refused rather than read twice (the command
    /// line reads those it holds: `eval::micro_batches_to_read`).
    pub fn validation_loss(&mut self, data: &TokenFile, batches: usize) -> Result<f64> {
        if batches == 0 {
            bail!("--eval-batches must be at least 1");
        }
        let (dev, batch, seq_len) = (self.dev, self.train.batch, self.train.seq_len);
        let held = data.micro_batches(batch, seq_len);
        if batches > held {
            bail!(
                "{} holds {} of B x T tokens, fewer than the {batches} asked for validation",
                data.path.display(),
                crate::words::counted(held as u64, "micro-batch")
            );
        }
        let n_layer = self.model.n_layer();
        let mut clock = Clock::default();
        self.fetch_head(&mut clock)?;
        let mut sum = 0.0f64;
        for g in 0..batches {
            let (x, y) = data.micro_batch(g, batch, seq_len)?;
            let (x_dev, y) = (dev.tokens(&x)?, dev.tokens(&y)?);
            self.embed(&x, &x_dev, None, &mut clock)?;
            for l in 0..n_layer {
                let slot = self.ensure_block(l, &mut clock)?;
                let d = &self.device;
                let acts = &d.block_acts[l.min(d.block_acts.len() - 1)];
                self.model.block_forward(dev, l, &d.slots[slot], acts, &d.residual[l], &d.residual[l + 1], batch, seq_len, None);
            }
            sum += self.head_loss(&y, None, &mut clock)? as f64;
        }
        // Forward only: what `--params-ram-cache` held for a backward goes back now.
        self.release_held(&mut clock)?;
        let loss = sum / batches as f64;
        if !loss.is_finite() {
            bail!("the validation loss on {} is {loss} (not finite): the weights hold NaN or infinite values", data.path.display());
        }
        Ok(loss)
    }
}
