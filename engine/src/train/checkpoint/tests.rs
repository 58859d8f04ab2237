//! Checkpoint refusals that need several ranks.

use crate::comm::Comm;
use crate::comm::local::LocalWorld;

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
