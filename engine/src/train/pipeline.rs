//! One optimizer step as data: the ordered list of operations the trainer executes (fetch a group from
//! its tier, gather it from the ranks, upload it, compute, download gradients, reduce-scatter them,
//! take the global norm, update, gather the new working copy), for the overlapped schedule and for the
//! strictly sequential one that is its oracle. `Trainer::train_step` runs whatever list this returns,
//! so the schedule a test prints is the schedule that runs.

use std::fmt;

/// One operation of a training step. Blocks are numbered from 0; `micro` is this rank's accumulation index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Wait for the head group's update, gather it (several ranks), upload it; it stays for the step.
    FetchHead,
    /// Upload micro-batch `micro`'s tokens (zeroing the head's gradients) and embed them.
    Embed {
        micro: usize,
    },
    /// Make block `block` resident in a slot: wait for its update, read it from its tier, gather it from
    /// the ranks, upload it (nothing if the slot still holds it this step).
    Fetch {
        block: usize,
    },
    /// Start reading block `block`'s working copy from NVMe on the read-ahead thread, so the read
    /// overlaps the computation that follows and its `Fetch` finds it resident (nothing when the copy
    /// is not on NVMe, is resident already, its update is not done yet, or its slot still holds it).
    ReadAhead {
        block: usize,
    },
    Forward {
        block: usize,
    },
    /// The vocabulary projection, the loss and their backward.
    Head,
    /// Block `block`'s backward (recomputing its activations first with --recompute) into one of the
    /// two gradient buffers.
    Backward {
        block: usize,
    },
    /// Start downloading block `block`'s gradients.
    BeginDownload {
        block: usize,
    },
    /// Finish that download, reduce-scatter it between ranks (stages 2-3) and add it to the accumulator.
    FinishDownload {
        block: usize,
    },
    /// The embedding's backward; waits for the device.
    EmbedBackward,
    /// Download the head's gradients of the micro-batch, reduce-scatter them (stages 2-3) and add them
    /// to the accumulator, as `FinishDownload` does a block's.
    DownloadHead,
    /// Stage 1 with several ranks: reduce-scatter each group's locally summed gradients.
    ReduceStage1,
    /// Agree on the loss, the global norm and fp16 overflow across ranks; hand the update to the AdamW
    /// thread (which gathers nothing: the next step's fetches gather the new working copy).
    Update,
    /// Wait for the AdamW thread to finish this step's update, its state written back to its tier (the
    /// sequential schedule only).
    AwaitUpdate,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Embed { micro } => write!(f, "embed[{micro}]"),
            Op::Fetch { block } => write!(f, "fetch h.{block}"),
            Op::ReadAhead { block } => write!(f, "read-ahead h.{block}"),
            Op::Forward { block } => write!(f, "forward h.{block}"),
            Op::Backward { block } => write!(f, "backward h.{block}"),
            Op::BeginDownload { block } => write!(f, "download> h.{block}"),
            Op::FinishDownload { block } => write!(f, "download< h.{block}"),
            other => write!(f, "{}", format!("{other:?}").to_lowercase()),
        }
    }
}

/// The operations of one step over `n_layer` blocks and `accum` micro-batches, made one micro-batch at
/// a time as they are taken (a step of many micro-batches is never held whole). Overlapped: the next
/// block's working copy is read ahead from NVMe while a block computes, its fetch is issued while the
/// block computes on an asynchronous device, and a block's gradient download is finished only
/// after the next block's backward is submitted (two gradient buffers); the update runs behind the next
/// step. Sequential: each operation waits for the one before.
pub fn step_schedule(n_layer: usize, accum: usize, overlapped: bool) -> impl Iterator<Item = Op> {
    let end = [Op::ReduceStage1, Op::Update].into_iter().chain((!overlapped).then_some(Op::AwaitUpdate));
    std::iter::once(Op::FetchHead).chain((0..accum).flat_map(move |micro| micro_batch_ops(n_layer, micro, overlapped))).chain(end)
}

/// One micro-batch's operations: embed, the blocks' forward, the head, the blocks' backward with their
/// downloads, the embedding's backward, the head's download.
fn micro_batch_ops(n_layer: usize, micro: usize, overlapped: bool) -> Vec<Op> {
    let mut ops = vec![Op::Embed { micro }];
    for block in 0..n_layer {
        ops.push(Op::Fetch { block });
        if overlapped && block + 1 < n_layer {
            ops.push(Op::ReadAhead { block: block + 1 });
        }
        ops.push(Op::Forward { block });
        if overlapped && block + 1 < n_layer {
            ops.push(Op::Fetch { block: block + 1 });
        }
    }
    ops.push(Op::Head);
    for block in (0..n_layer).rev() {
        ops.push(Op::Fetch { block });
        if overlapped && block > 0 {
            ops.push(Op::ReadAhead { block: block - 1 });
        }
        ops.push(Op::Backward { block });
        if overlapped {
            if block > 0 {
                ops.push(Op::Fetch { block: block - 1 });
            }
            if block + 1 < n_layer {
                ops.push(Op::FinishDownload { block: block + 1 });
            }
            ops.push(Op::BeginDownload { block });
        } else {
            ops.push(Op::BeginDownload { block });
            ops.push(Op::FinishDownload { block });
        }
    }
    if overlapped && n_layer > 0 {
        ops.push(Op::FinishDownload { block: 0 });
    }
    ops.push(Op::EmbedBackward);
    ops.push(Op::DownloadHead);
    ops
}

/// The schedule one line per micro-batch phase, for reading: `fetch h.0, forward h.0, ...`.
pub fn describe(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        let starts_line = matches!(op, Op::Embed { .. } | Op::Head | Op::EmbedBackward | Op::DownloadHead);
        if i > 0 {
            out.push_str(if starts_line { "\n" } else { ", " });
        }
        out.push_str(&op.to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block is fetched before it computes, every download begun is finished before the micro-batch
    /// ends, at most two gradient buffers are in flight, and both schedules run the same computations
    /// in the same order (so they give the same numbers).
    #[test]
    fn both_schedules_compute_the_same_things_and_respect_their_dependencies() {
        for (n_layer, accum) in [(1, 1), (2, 1), (4, 3)] {
            let (over, seq): (Vec<Op>, Vec<Op>) =
                (step_schedule(n_layer, accum, true).collect(), step_schedule(n_layer, accum, false).collect());
            let compute = |ops: &[Op]| -> Vec<Op> {
                ops.iter()
                    .copied()
                    .filter(|o| !matches!(o, Op::Fetch { .. } | Op::ReadAhead { .. } | Op::BeginDownload { .. } | Op::AwaitUpdate))
                    .collect()
            };
            let order = |ops: &[Op]| -> Vec<Op> { compute(ops).into_iter().filter(|o| !matches!(o, Op::FinishDownload { .. })).collect() };
            assert_eq!(order(&over), order(&seq), "same computations in the same order");
            for ops in [&over, &seq] {
                let mut fetched = std::collections::HashSet::new();
                let mut in_flight = Vec::new();
                // At most one read ahead at a time, and its block's fetch comes next.
                let mut read_ahead = None;
                for op in ops.iter() {
                    match *op {
                        Op::ReadAhead { block } => {
                            assert_eq!(read_ahead.replace(block), None, "{op}: a read ahead not yet fetched");
                        }
                        Op::Fetch { block } => {
                            if let Some(ahead) = read_ahead.take() {
                                assert_eq!(ahead, block, "{op} while h.{ahead} is read ahead");
                            }
                            fetched.insert(block);
                        }
                        Op::Forward { block } | Op::Backward { block } => assert!(fetched.contains(&block), "{op} before its fetch"),
                        Op::BeginDownload { block } => {
                            in_flight.push(block);
                            assert!(in_flight.len() <= 2, "more downloads in flight than gradient buffers");
                        }
                        Op::FinishDownload { block } => {
                            assert_eq!(in_flight.first(), Some(&block), "downloads finish in the order they began");
                            in_flight.remove(0);
                        }
                        Op::EmbedBackward => assert!(in_flight.is_empty(), "a download outlives its micro-batch"),
                        _ => {}
                    }
                }
            }
        }
        let printed = describe(&step_schedule(2, 1, true).collect::<Vec<_>>());
        println!(
            "overlapped, 2 blocks:\n{printed}\n\nsequential, 2 blocks:\n{}",
            describe(&step_schedule(2, 1, false).collect::<Vec<_>>())
        );
        assert!(printed.contains("fetch h.0, read-ahead h.1, forward h.0, fetch h.1, fetch h.1, forward h.1"), "{printed}");
        assert!(printed.contains("fetch h.1, read-ahead h.0, backward h.1, fetch h.0"), "{printed}");
        assert!(printed.contains("backward h.0, download< h.1, download> h.0"), "{printed}");
    }
}
