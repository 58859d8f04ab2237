//! Shard files on the NVMe tier as the disk sees them: a write goes to a spare file from the
//! directory's bounded pool and takes the current one's name (never the only copy in place), a write
//! cut short leaves the old state, damage is named, and symlinks inside the directory are refused
//! rather than followed — under every I/O engine and both ways a spare takes the shard's name
//! (`common::setups`).

mod common;

use std::path::{Path, PathBuf};

use common::{FOOTER, Setup, nvme_in, read, setups, spares, streaming, write};
use zerostream_offload::{SPARE_PREFIX, Stored, Tier};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn next_of(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.next", path.display()))
}

/// Makes every spare write into `dir` fail before it starts: the idle spares go, and directories
/// stand where the fresh ones would be created.
fn block_spares(dir: &Path) {
    spares(dir).iter().for_each(|p| std::fs::remove_file(p).unwrap());
    (0..256).for_each(|n| std::fs::create_dir_all(dir.join(format!("{SPARE_PREFIX}{n}/blocker"))).unwrap());
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn flip(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

/// The first `len` bytes of an open file, read through its own descriptor (whatever name it has now).
fn read_through(mut file: &std::fs::File, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = vec![0u8; len];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut bytes).unwrap();
    bytes
}

/// The directory's only spare (there must be exactly one).
fn only_spare(dir: &Path, setup: Setup) -> PathBuf {
    let all = spares(dir);
    assert_eq!(all.len(), 1, "{setup}: {all:?}");
    all[0].clone()
}

#[test]
fn a_write_goes_to_the_spare_and_the_spare_is_the_previous_version() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        let len = 3 * 4096 + 10;
        let mut t = Stored::new("g.master", len, Tier::Nvme, Some(&nv)).unwrap();
        let path = nv.shard_path("g.master");
        let (v1, v2, v3) = (pattern(len, 1), pattern(len, 2), pattern(len, 3));
        write(&mut t, &nv, &v1);
        let spare = only_spare(dir.path(), setup);
        let mut shard_names = vec![spare.file_name().unwrap().to_string_lossy().into_owned(), ".zerostream.lock".into()];
        shard_names.push("g.master.rank0.bin".into());
        assert_eq!(names(dir.path()), shard_names, "{setup}: the shard and one spare, no .crc");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (4 * 4096 + FOOTER) as u64);
        assert_eq!(std::fs::metadata(&spare).unwrap().len(), (4 * 4096 + FOOTER) as u64, "{setup}: the spare has the shard's size");
        // Keep the first version's file open: the second write must go to another file, not over it.
        let first = std::fs::File::open(&path).unwrap();
        write(&mut t, &nv, &v2);
        assert!(read_through(&first, len) == v1, "{setup}: the first version was overwritten in place");
        // The exchange leaves the previous version under the written spare's name; the portable
        // install under a fresh one (a link made before the rename).
        let exchanged = setup.exchange && cfg!(any(target_os = "linux", target_os = "macos"));
        assert_eq!(only_spare(dir.path(), setup) == spare, exchanged, "{setup}: which install ran");
        #[cfg(unix)]
        {
            let (first, now) = (first.metadata().unwrap(), std::fs::metadata(&path).unwrap());
            assert!(!common::same_inode(&first, &now), "{setup}: another inode");
            let spare = only_spare(dir.path(), setup);
            assert!(common::same_inode(&first, &std::fs::metadata(spare).unwrap()), "{setup}: v1 is the spare");
        }
        assert!(read(&mut t, &nv).unwrap() == v2, "{setup}: the second version reads back");
        // The third write reuses the first version's file (its blocks stay allocated), and leaves the
        // second version's whole.
        let second = std::fs::File::open(&path).unwrap();
        write(&mut t, &nv, &v3);
        #[cfg(unix)]
        assert!(common::same_inode(&first.metadata().unwrap(), &std::fs::metadata(&path).unwrap()), "{setup}: the spare reused");
        assert!(read_through(&first, len) == v3, "{setup}: the first version's file holds the third");
        assert!(read_through(&second, len) == v2, "{setup}: the second version was overwritten in place");
        assert!(read(&mut t, &nv).unwrap() == v3, "{setup}: the third version reads back");
        assert_eq!(spares(dir.path()).len(), 1, "{setup}");
        // Closing the directory removes the spare; a later run reuses the file and reads the last version.
        drop(t);
        drop(nv);
        assert_eq!(names(dir.path()), [".zerostream.lock", "g.master.rank0.bin"], "{setup}: no spare at rest");
        let nv = nvme_in(dir.path(), setup, true);
        let mut again = Stored::new("g.master", len, Tier::Nvme, Some(&nv)).unwrap();
        assert!(read(&mut again, &nv).unwrap() == v3, "{setup}: after reopening");
    }
}

#[test]
fn an_interrupted_write_leaves_the_old_state_and_its_leftover_is_removed_on_reopen() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let len = 5000;
        let v1 = pattern(len, 7);
        let path = {
            let nv = nvme_in(dir.path(), setup, true);
            write(&mut Stored::new("w", len, Tier::Nvme, Some(&nv)).unwrap(), &nv, &v1);
            nv.shard_path("w")
        };
        // What a write killed part-way leaves: a whole-sized file of garbage, a truncated one, an empty
        // one, as a pool spare (the next run's first spare name among them) or as an earlier version's
        // `.next`; and a symlink, whose target must survive.
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("precious");
        std::fs::write(&target, b"precious").unwrap();
        let leftovers = [pattern(2 * 4096 + FOOTER, 99), pattern(100, 3), Vec::new()];
        for leftover in leftovers {
            let planted = [next_of(&path), dir.path().join(format!("{SPARE_PREFIX}0")), dir.path().join(format!("{SPARE_PREFIX}17"))];
            planted.iter().for_each(|p| std::fs::write(p, &leftover).unwrap());
            #[cfg(unix)]
            std::os::unix::fs::symlink(&target, dir.path().join(format!("{SPARE_PREFIX}1"))).unwrap();
            let nv = nvme_in(dir.path(), setup, true);
            let n = leftover.len();
            assert!(spares(dir.path()).is_empty(), "{setup}: leftover spares of {n} bytes are removed when the directory is opened");
            let mut t = Stored::new("w", len, Tier::Nvme, Some(&nv)).unwrap();
            assert!(!next_of(&path).exists(), "{setup}: the leftover .next of {n} bytes is removed on open");
            assert!(read(&mut t, &nv).unwrap() == v1, "{setup}: the old state reads back past a leftover of {n} bytes");
            assert_eq!(std::fs::read(&target).unwrap(), b"precious");
            // The next write goes through the pool as ever.
            write(&mut t, &nv, &v1);
            assert_eq!(spares(dir.path()).len(), 1, "{setup}");
        }
    }
}

#[test]
fn a_failed_write_keeps_the_old_state() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        let v1 = pattern(4096, 5);
        let mut t = Stored::new("f", 4096, Tier::Nvme, Some(&nv)).unwrap();
        write(&mut t, &nv, &v1);
        // Directories where the write's spare must go: the write cannot start.
        block_spares(dir.path());
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().fill(0xee);
        let err = t.page_out(Some(&nv), true).unwrap_err().to_string();
        assert!(err.contains("writing shard") && err.contains("f.rank0.bin") && err.contains(SPARE_PREFIX), "{setup}: {err}");
        assert!(read(&mut t, &nv).unwrap() == v1, "{setup}: the old state survives the failed write");
    }
}

#[test]
fn damaged_data_and_footers_are_named_errors() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        let len = 6000;
        let mut t = Stored::new("d", len, Tier::Nvme, Some(&nv)).unwrap();
        let path = nv.shard_path("d");
        let footer = 2 * 4096;
        let cases: [(usize, &[&str]); 4] = [
            (123, &["checksum mismatch", "corrupt"]),                // a data byte
            (footer + 2, &["another version", "another model"]),     // the magic
            (footer + 17, &["footer checksum mismatch", "corrupt"]), // the length field
            (footer + 25, &["footer checksum mismatch", "corrupt"]), // the data's CRC field
        ];
        for (at, words) in cases {
            write(&mut t, &nv, &pattern(len, 1));
            flip(&path, at);
            let err = read(&mut t, &nv).unwrap_err();
            assert!(err.contains("d.rank0.bin") && words.iter().all(|w| err.contains(w)), "{setup}, byte {at}: {err}");
        }
        // Same file size, another length: a file written for another model.
        write(&mut t, &nv, &pattern(len, 1));
        let mut other = Stored::new("d", len + 100, Tier::Nvme, Some(&nv)).unwrap();
        let err = read(&mut other, &nv).unwrap_err();
        assert!(err.contains("holds 6000 bytes, expected 6100") && err.contains("another model"), "{setup}: {err}");
    }
}

#[test]
fn without_verification_no_checksum_is_written_and_a_verifying_run_says_so() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = pattern(4096, 9);
        {
            let nv = nvme_in(dir.path(), setup, false);
            let mut t = Stored::new("n", 4096, Tier::Nvme, Some(&nv)).unwrap();
            write(&mut t, &nv, &v1);
            assert!(read(&mut t, &nv).unwrap() == v1, "{setup}");
        }
        let nv = nvme_in(dir.path(), setup, true);
        let mut t = Stored::new("n", 4096, Tier::Nvme, Some(&nv)).unwrap();
        let err = read(&mut t, &nv).unwrap_err();
        assert!(err.contains("n.rank0.bin") && err.contains("without a checksum"), "{setup}: {err}");
    }
}

// Creating symbolic links takes a privilege on Windows: the refusal is tested on Unix.
#[cfg(unix)]
#[test]
fn a_symlink_where_a_shard_should_be_is_refused_and_its_target_untouched() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        let target = elsewhere.path().join("precious");
        std::fs::write(&target, b"precious").unwrap();
        let path = nv.shard_path("s");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = Stored::new("s", 4096, Tier::Nvme, Some(&nv)).err().unwrap().to_string();
        assert!(err.contains(&*path.to_string_lossy()) && err.contains("symlinks") && err.contains("not followed"), "{setup}: {err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        // A dangling link is refused too, and its target is not created.
        let missing = elsewhere.path().join("missing");
        std::os::unix::fs::symlink(&missing, nv.shard_path("t")).unwrap();
        let err = Stored::new("t", 4096, Tier::Nvme, Some(&nv)).err().unwrap().to_string();
        assert!(err.contains("t.rank0.bin") && err.contains("not followed"), "{setup}: {err}");
        assert!(!missing.exists());
    }
}

#[cfg(unix)]
#[test]
fn a_symlink_planted_as_the_next_file_or_the_shard_is_replaced_not_written_through() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        let target = elsewhere.path().join("precious");
        std::fs::write(&target, b"precious").unwrap();
        let mut t = Stored::new("p", 4096, Tier::Nvme, Some(&nv)).unwrap();
        let path = nv.shard_path("p");
        // Links where the next spares will be created.
        for n in 0..4 {
            std::os::unix::fs::symlink(&target, dir.path().join(format!("{SPARE_PREFIX}{n}"))).unwrap();
        }
        write(&mut t, &nv, &pattern(4096, 1));
        // After the shard was opened, a link put in its place is renamed over, not written through.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&mut t, &nv, &pattern(4096, 2));
        assert_eq!(std::fs::read(&target).unwrap(), b"precious", "{setup}");
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink(), "{setup}");
        assert!(read(&mut t, &nv).unwrap() == pattern(4096, 2), "{setup}");
    }
}

#[cfg(unix)]
#[test]
fn the_lock_file_as_a_symlink_is_refused() {
    use zerostream_offload::{IoConfig, IoEngine, NvmeDir};
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("precious");
    std::fs::write(&target, b"precious").unwrap();
    let lock = dir.path().join(".zerostream.lock");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let err = NvmeDir::new(dir.path(), IoEngine::new(IoConfig::default()).unwrap(), true, 0).unwrap_err().to_string();
    assert!(err.contains(&*lock.to_string_lossy()) && err.contains("not followed"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
}

#[test]
fn a_batch_pages_tensors_of_both_tiers_in_and_out_together() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_in(dir.path(), setup, true);
        // Awkward sizes, a RAM tensor among them, and one tensor already resident.
        let lens = [100usize, 3 * 8192 + 5, 4096, 70_001];
        let mut tensors: Vec<Stored> = lens
            .iter()
            .enumerate()
            .map(|(k, &n)| Stored::new(&format!("b{k}"), n, if k == 2 { Tier::Ram } else { Tier::Nvme }, Some(&nv)).unwrap())
            .collect();
        for (k, t) in tensors.iter_mut().enumerate() {
            t.page_in_zeroed(Some(&nv));
            t.data_mut().bytes_mut().copy_from_slice(&pattern(lens[k], k as u8));
        }
        let mut all: Vec<&mut Stored> = tensors.iter_mut().collect();
        Stored::page_out_all(&mut all, Some(&nv), true).unwrap();
        assert!(all.iter().enumerate().all(|(k, t)| t.is_resident() == (k == 2)), "{setup}: NVMe tensors paged out, RAM kept");
        assert_eq!(nv.traffic(), (0, (lens[0] + lens[1] + lens[3]) as u64), "{setup}: bytes written");
        all[3].page_in(Some(&nv)).unwrap();
        Stored::page_in_all(&mut all, Some(&nv)).unwrap();
        for (k, t) in all.iter().enumerate() {
            assert!(t.data().bytes() == pattern(lens[k], k as u8), "{setup}: tensor {k} after the round trip");
        }
        // Read once each: the batch skipped the tensor already resident.
        assert_eq!(nv.traffic().0, (lens[0] + lens[1] + lens[3]) as u64, "{setup}: bytes read");
    }
}

#[test]
fn a_batch_names_the_damaged_shard_and_leaves_nothing_half_paged_in() {
    for setup in streaming() {
        check_a_damaged_batch(setup);
    }
}

fn check_a_damaged_batch(setup: Setup) {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme_in(dir.path(), setup, true);
    let len = 3 * 4096;
    let mut tensors: Vec<Stored> = (0..3).map(|k| Stored::new(&format!("c{k}"), len, Tier::Nvme, Some(&nv)).unwrap()).collect();
    for (k, t) in tensors.iter_mut().enumerate() {
        write(t, &nv, &pattern(len, k as u8));
    }
    flip(&nv.shard_path("c1"), 5000);
    let mut all: Vec<&mut Stored> = tensors.iter_mut().collect();
    let err = Stored::page_in_all(&mut all, Some(&nv)).unwrap_err().to_string();
    assert!(err.contains("c1.rank0.bin") && err.contains("checksum mismatch"), "{setup}: {err}");
    assert!(all.iter().all(|t| !t.is_resident()), "{setup}: no tensor of a failed batch is resident");
    // A write that cannot start for the last tensor: no tensor of the batch is written, and every
    // buffer leaves.
    // Written in one batch, the three leave three idle spares: they serve the first three of four
    // below; the last must create one, and cannot (directories stand at every free spare name).
    for (k, t) in all.iter_mut().enumerate() {
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().copy_from_slice(&pattern(len, k as u8));
    }
    Stored::page_out_all(&mut all, Some(&nv), true).unwrap();
    let mut fourth = Stored::new("c3", len, Tier::Nvme, Some(&nv)).unwrap();
    all.push(&mut fourth);
    let idle = spares(dir.path());
    assert_eq!(idle.len(), 3, "{setup}: {idle:?}");
    let free_names = (0..256).map(|n| dir.path().join(format!("{SPARE_PREFIX}{n}"))).filter(|p| !p.exists());
    free_names.for_each(|p| std::fs::create_dir_all(p.join("blocker")).unwrap());
    for t in all.iter_mut() {
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().fill(0xee);
    }
    let err = Stored::page_out_all(&mut all, Some(&nv), true).unwrap_err().to_string();
    assert!(err.contains("c3.rank0.bin") && err.contains(SPARE_PREFIX), "{setup}: {err}");
    let err = read(all[3], &nv).unwrap_err();
    assert!(err.contains("never completely written"), "{setup}: c3 was never written: {err}");
    all.pop();
    assert!(all.iter().all(|t| !t.is_resident()));
    assert!(read(all[2], &nv).unwrap() == pattern(len, 2), "{setup}: the failed tensor's old state survives");
    for (k, t) in all.iter_mut().take(2).enumerate() {
        assert!(read(t, &nv).unwrap() == pattern(len, k as u8), "{setup}: tensor {k}: nothing written when the batch cannot start");
    }
}
