//! The gradients' reduce-scatter between ranks, compressed or not (`--grad-compression`), with this
//! rank's error-feedback residuals: one per group, as long as the group's padded buffer (the parts
//! bound for other ranks; this rank's own slice crosses no wire and stays zero), kept in RAM and
//! checkpointed in the rank's optimizer file as `{group}.grad_residual`, so a resumed run equals an
//! uninterrupted one bit for bit.

use anyhow::{Result, bail};

use super::checkpoint::Checkpoint;
use super::shard::{GroupShard, Sharding};
use super::{ModelSource, TrainConfig};
use crate::comm::Comm;
use crate::comm::compress::{Codec, GradCompression};

pub(super) struct GradExchange {
    pub codec: Codec,
    /// Per group (empty: no compression, or one rank).
    pub residuals: Vec<Vec<f32>>,
}

impl GradExchange {
    /// The exchange for `train`'s mode: residuals from the checkpoint being resumed at the same world
    /// size, else zero; `notes` gets why a mode does nothing or residuals start again.
    pub fn new(
        train: &TrainConfig,
        sharding: &Sharding,
        shards: &[GroupShard],
        names: &[&str],
        source: &ModelSource<'_>,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let codec = Codec::new(train.grad_compression, train.grad_compression_chunk)?;
        let mut residuals = Vec::new();
        if codec.mode == GradCompression::None {
            return Ok(GradExchange { codec, residuals });
        }
        if sharding.world == 1 {
            notes.push(format!("--grad-compression {} does nothing with one rank: no gradient crosses between ranks", codec.mode));
            return Ok(GradExchange { codec, residuals });
        }
        let resumed = match source {
            ModelSource::Checkpoint(c) if c.state.world_size == sharding.world => Some(c),
            ModelSource::Checkpoint(c) => {
                notes.push(format!(
                    "--grad-compression {}: the error-feedback residuals of the checkpoint's {} ranks do not map onto {} ranks' slices; \
                     they start again from zero",
                    codec.mode, c.state.world_size, sharding.world
                ));
                None
            }
            _ => None,
        };
        for (shard, name) in shards.iter().zip(names) {
            let mut r = vec![0.0f32; shard.padded_len];
            if let Some(c) = resumed {
                read_residual(c, sharding.rank, name, &mut r)?;
            }
            residuals.push(r);
        }
        Ok(GradExchange { codec, residuals })
    }

    /// Group `k`'s reduce-scatter: `mine` = the sum over ranks of their parts of this rank's slice of
    /// `whole`, each sent as the codec encodes it (exactly, for `none`).
    pub fn reduce(&mut self, comm: &Comm, k: usize, whole: &[f32], mine: &mut [f32], device_busy: bool) -> Result<()> {
        match self.residuals.get_mut(k) {
            Some(residual) => comm.reduce_scatter_sum_compressed(whole, mine, &self.codec, residual, device_busy),
            None => comm.reduce_scatter_sum(whole, mine, device_busy),
        }
    }
}

/// This rank's residual of `group` from checkpoint `c` (written by the same rank at the same world size).
fn read_residual(c: &Checkpoint, rank: usize, group: &str, out: &mut [f32]) -> Result<()> {
    match c.rank_tensor(rank, &format!("{group}.grad_residual"))? {
        Some(values) if values.len() == out.len() => {
            out.copy_from_slice(&values);
            Ok(())
        }
        Some(values) => bail!(
            "{}: rank {rank}'s {group}.grad_residual holds {} values; this run's group needs {}",
            c.dir.display(),
            values.len(),
            out.len()
        ),
        None => bail!(
            "{}: rank {rank}'s optimizer file has no {group}.grad_residual (the error-feedback residual --grad-compression resumes from)",
            c.dir.display()
        ),
    }
}
