//! Checkpoint refusals that need several ranks, or a rank's file not where rank 0 commits it.

use crate::comm::Comm;
use crate::comm::local::LocalWorld;

use std::collections::BTreeMap;

use super::{FileDigest, check_every_file_is_here};

/// At stage 0 the replicas are the same bits; where one rank's differ by one bit, every rank
/// refuses the checkpoint, naming that rank and the group.
#[test]
fn diverged_replicas_are_refused_by_rank_and_group() {
    let outcomes: Vec<(Result<(), String>, Result<(), String>)> = std::thread::scope(|s| {
        let ranks: Vec<_> = LocalWorld::new(3)
            .into_iter()
            .enumerate()
            .map(|(rank, local)| {
                s.spawn(move || {
                    let comm = Comm::new(Box::new(local));
                    let mut master: Vec<f32> = (0..100).map(|i| i as f32 * 0.25).collect();
                    let agree = super::check_replicas_agree(&comm, "h.0", &master).map_err(|e| e.to_string());
                    if rank == 2 {
                        master[7] = f32::from_bits(master[7].to_bits() ^ 1);
                    }
                    let differ = super::check_replicas_agree(&comm, "h.0", &master).map_err(|e| e.to_string());
                    (agree, differ)
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect()
    });
    for (rank, (agree, differ)) in outcomes.into_iter().enumerate() {
        assert_eq!(agree, Ok(()), "rank {rank}");
        let e = differ.expect_err("a diverged replica was accepted");
        assert!(e.contains("rank 2's master weights of h.0 differ from rank 0's"), "rank {rank}: {e}");
    }
}

/// A rank's file missing from the directory rank 0 commits (ranks that do not share the filesystem),
/// or of another size than its writer wrote, stops the commit, naming it.
#[test]
fn a_checkpoint_missing_a_ranks_file_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("optimizer.rank0.safetensors"), [0u8; 8]).unwrap();
    let digest = |bytes| FileDigest { bytes, crc32: 0 };
    let mut files = BTreeMap::from([("optimizer.rank0.safetensors".to_string(), digest(8))]);
    check_every_file_is_here(dir.path(), &files).unwrap();
    files.insert("optimizer.rank1.safetensors".into(), digest(8));
    let err = check_every_file_is_here(dir.path(), &files).unwrap_err().to_string();
    assert!(err.contains("optimizer.rank1.safetensors is missing") && err.contains("same --checkpoint-dir"), "{err}");
    files.insert("optimizer.rank0.safetensors".into(), digest(9));
    let err = check_every_file_is_here(dir.path(), &files).unwrap_err().to_string();
    assert!(err.contains("optimizer.rank0.safetensors is 8 bytes, though its writer wrote 9 bytes"), "{err}");
}
