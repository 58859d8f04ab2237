//! The NVMe directory's pool of spare files: shard writes of one size share a bounded number of
//! spares (reused in place, the excess removed), however many shards and writers there are, and the
//! pool's files go with the directory — under every streaming engine and both installs.

mod common;

use std::path::Path;

use common::{FOOTER, Setup, nvme_in, read, spares, streaming};
use zerostream_offload::{SPARES_PER_SIZE, Stored, Tier};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

/// Bytes allocated to the files in `dir` (what `du` counts).
#[cfg(unix)]
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().blocks() * 512).sum()
}

/// Bytes of the files in `dir`: where std cannot tell allocated bytes (NTFS does not make these
/// files sparse, so their lengths are what they hold on disk).
#[cfg(not(unix))]
fn allocated_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// The spare files in `dir` whose size is `file_bytes`.
fn spares_of_size(dir: &Path, file_bytes: u64) -> usize {
    spares(dir).iter().filter(|p| std::fs::metadata(p).unwrap().len() == file_bytes).count()
}

#[test]
fn many_shards_of_one_size_share_a_bounded_pool_of_spares() {
    streaming().into_iter().for_each(check_a_bounded_pool);
}

fn check_a_bounded_pool(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme_in(dir.path(), setup, true);
    // Twelve shards of one size (a block group's master, m, v, grad, times three) and four of another.
    let (len, other_len) = (5 * 4096 + 3, 2 * 4096);
    let (file, other_file) = ((6 * 4096 + FOOTER) as u64, (2 * 4096 + FOOTER) as u64);
    let mut big: Vec<Stored> =
        (0..12).map(|k| Stored::new(&format!("g{}.t{}", k / 4, k % 4), len, Tier::Nvme, Some(&nv)).unwrap()).collect();
    let mut small: Vec<Stored> = (0..4).map(|k| Stored::new(&format!("s{k}"), other_len, Tier::Nvme, Some(&nv)).unwrap()).collect();
    let state_bytes = 12 * file + 4 * other_file;
    let bound_bytes = SPARES_PER_SIZE as u64 * (file + other_file);
    let check = |round: usize, what: &str| {
        assert!(spares_of_size(dir.path(), file) <= SPARES_PER_SIZE, "round {round} ({what}): {:?}", spares(dir.path()));
        assert!(spares_of_size(dir.path(), other_file) <= SPARES_PER_SIZE, "round {round} ({what}): {:?}", spares(dir.path()));
        let used = allocated_bytes(dir.path());
        assert!(
            used <= state_bytes + bound_bytes + 4096,
            "round {round} ({what}): {used} bytes on disk, state {state_bytes} + bound {bound_bytes}"
        );
    };
    for round in 0..6u8 {
        // All at once: more same-size writes in flight than the bound; what is left over is removed.
        let mut all: Vec<&mut Stored> = big.iter_mut().chain(small.iter_mut()).collect();
        for (k, t) in all.iter_mut().enumerate() {
            t.page_in_zeroed(Some(&nv));
            let want = pattern(t.len_bytes(), round.wrapping_mul(16).wrapping_add(k as u8));
            t.data_mut().bytes_mut().copy_from_slice(&want);
        }
        Stored::page_out_all(&mut all, Some(&nv), true).unwrap();
        check(round as usize, "one batch of all");
        // Group by group, as the update's write stage does: the idle spares are reused, none created
        // (the portable install gives each previous version a fresh spare name: the files, their
        // number and the bytes on disk stay, the names move on).
        let (before, bytes_before) = (spares(dir.path()), allocated_bytes(dir.path()));
        for group in big.chunks_mut(4) {
            let mut batch: Vec<&mut Stored> = group.iter_mut().take(3).collect();
            for t in batch.iter_mut() {
                t.page_in(Some(&nv)).unwrap();
            }
            Stored::page_out_all(&mut batch, Some(&nv), true).unwrap();
        }
        let after = spares(dir.path());
        let what = format!("{setup}, round {round}: steady-state writes reuse the pool's spares");
        assert_eq!(after.len(), before.len(), "{what}");
        assert_eq!(allocated_bytes(dir.path()), bytes_before, "{what}");
        if setup.exchange && cfg!(any(target_os = "linux", target_os = "macos")) {
            assert_eq!(after, before, "{what}");
        }
        check(round as usize, "group by group");
        let mut all: Vec<&mut Stored> = big.iter_mut().chain(small.iter_mut()).collect();
        for (k, t) in all.iter_mut().enumerate() {
            let want = pattern(t.len_bytes(), round.wrapping_mul(16).wrapping_add(k as u8));
            assert!(read(t, &nv).unwrap() == want, "{setup}, round {round}: shard {k} reads back its last version");
        }
    }
    assert_eq!(spares_of_size(dir.path(), file), SPARES_PER_SIZE, "{setup}: the pool fills up to its bound");
    // The pool's spares go with the directory.
    drop(nv);
    assert!(spares(dir.path()).is_empty(), "{setup}: {:?}", spares(dir.path()));
    assert_eq!(allocated_bytes(dir.path()), state_bytes, "{setup}: at rest the state alone");
}

#[test]
fn writers_on_two_threads_share_the_pool_and_each_shard_keeps_its_own_data() {
    streaming().into_iter().for_each(check_two_writers);
}

fn check_two_writers(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme_in(dir.path(), setup, true);
    let len = 3 * 4096;
    let file = (3 * 4096 + FOOTER) as u64;
    let mut sides: [Vec<Stored>; 2] =
        [0, 1].map(|side| (0..3).map(|k| Stored::new(&format!("t{side}.{k}"), len, Tier::Nvme, Some(&nv)).unwrap()).collect());
    std::thread::scope(|scope| {
        for (side, shards) in sides.iter_mut().enumerate() {
            let nv = &nv;
            scope.spawn(move || {
                for round in 0..40u8 {
                    let mut batch: Vec<&mut Stored> = shards.iter_mut().collect();
                    for (k, t) in batch.iter_mut().enumerate() {
                        t.page_in_zeroed(Some(nv));
                        t.data_mut().bytes_mut().copy_from_slice(&pattern(len, round ^ (side as u8 * 8 + k as u8)));
                    }
                    Stored::page_out_all(&mut batch, Some(nv), true).unwrap();
                    for (k, t) in batch.iter_mut().enumerate() {
                        assert!(
                            read(t, nv).unwrap() == pattern(len, round ^ (side as u8 * 8 + k as u8)),
                            "{setup}: side {side}, round {round}, shard {k}"
                        );
                    }
                }
            });
        }
    });
    let left = spares_of_size(dir.path(), file);
    assert!((3..=SPARES_PER_SIZE).contains(&left), "{setup}: {left} spares after batches of 3 on two threads");
}
