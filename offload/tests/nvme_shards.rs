//! Shard files on the NVMe tier as the disk sees them: a write goes to a spare file from the
//! directory's bounded pool and is exchanged with the current one (never the only copy in place), a
//! write cut short leaves the old state, damage is named, and symlinks inside the directory are
//! refused rather than followed.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{FOOTER, nvme_with, read, spares};
use zerostream_offload::{IoConfig, IoEngine, IoEngineKind, NvmeDir, SPARE_PREFIX, Stored, Tier};

fn nvme(dir: &Path) -> NvmeDir {
    nvme_with(dir, IoEngineKind::Pread, true)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Writes `bytes` as the whole of tensor `t`.
fn write(t: &mut Stored, nv: &NvmeDir, bytes: &[u8]) {
    t.page_in_zeroed(Some(nv));
    t.data_mut().bytes_mut().copy_from_slice(bytes);
    t.page_out(Some(nv), true).unwrap();
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

#[test]
fn a_write_goes_to_the_spare_and_the_spare_is_the_previous_version() {
    for engine in [IoEngineKind::Uring, IoEngineKind::Pread, IoEngineKind::Mmap] {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_with(dir.path(), engine, true);
        let len = 3 * 4096 + 10;
        let mut t = Stored::new("g.master", len, Tier::Nvme, Some(&nv)).unwrap();
        let path = nv.shard_path("g.master");
        let (v1, v2, v3) = (pattern(len, 1), pattern(len, 2), pattern(len, 3));
        write(&mut t, &nv, &v1);
        let spare = dir.path().join(format!("{SPARE_PREFIX}0"));
        let shard_names = [".zerostream-spare-0", ".zerostream.lock", "g.master.rank0.bin"];
        assert_eq!(names(dir.path()), shard_names, "{engine}: the shard and one spare, no .crc");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), (4 * 4096 + FOOTER) as u64);
        assert_eq!(std::fs::metadata(&spare).unwrap().len(), (4 * 4096 + FOOTER) as u64, "{engine}: the spare has the shard's size");
        // Keep the first version's file open: the second write must go to another file, not over it.
        let first = std::fs::File::open(&path).unwrap();
        write(&mut t, &nv, &v2);
        assert_ne!(first.metadata().unwrap().ino(), std::fs::metadata(&path).unwrap().ino(), "{engine}: another inode");
        let mut old = vec![0u8; len];
        std::os::unix::fs::FileExt::read_exact_at(&first, &mut old, 0).unwrap();
        assert!(old == v1, "{engine}: the first version was overwritten in place");
        assert_eq!(first.metadata().unwrap().ino(), std::fs::metadata(&spare).unwrap().ino(), "{engine}: v1 is the spare");
        assert!(read(&mut t, &nv).unwrap() == v2, "{engine}: the second version reads back");
        // The third write reuses the first version's file (its blocks stay allocated), and leaves the
        // second version's whole.
        let second = std::fs::File::open(&path).unwrap();
        write(&mut t, &nv, &v3);
        assert_eq!(first.metadata().unwrap().ino(), std::fs::metadata(&path).unwrap().ino(), "{engine}: the spare reused");
        std::os::unix::fs::FileExt::read_exact_at(&second, &mut old, 0).unwrap();
        assert!(old == v2, "{engine}: the second version was overwritten in place");
        assert!(read(&mut t, &nv).unwrap() == v3, "{engine}: the third version reads back");
        assert_eq!(names(dir.path()), shard_names, "{engine}");
        // Closing the directory removes the spare; a later run reuses the file and reads the last version.
        drop(t);
        drop(nv);
        assert_eq!(names(dir.path()), [".zerostream.lock", "g.master.rank0.bin"], "{engine}: no spare at rest");
        let nv = nvme_with(dir.path(), engine, true);
        let mut again = Stored::new("g.master", len, Tier::Nvme, Some(&nv)).unwrap();
        assert!(read(&mut again, &nv).unwrap() == v3, "{engine}: after reopening");
    }
}

#[test]
fn an_interrupted_write_leaves_the_old_state_and_its_leftover_is_removed_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let len = 5000;
    let v1 = pattern(len, 7);
    let path = {
        let nv = nvme(dir.path());
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
        std::os::unix::fs::symlink(&target, dir.path().join(format!("{SPARE_PREFIX}1"))).unwrap();
        let nv = nvme(dir.path());
        assert!(spares(dir.path()).is_empty(), "leftover spares of {} bytes are removed when the directory is opened", leftover.len());
        let mut t = Stored::new("w", len, Tier::Nvme, Some(&nv)).unwrap();
        assert!(!next_of(&path).exists(), "the leftover .next of {} bytes is removed on open", leftover.len());
        assert!(read(&mut t, &nv).unwrap() == v1, "the old state reads back past a leftover of {} bytes", leftover.len());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
        // The next write goes through the pool as ever.
        write(&mut t, &nv, &v1);
        assert_eq!(spares(dir.path()).len(), 1);
    }
}

#[test]
fn a_failed_write_keeps_the_old_state() {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme(dir.path());
    let v1 = pattern(4096, 5);
    let mut t = Stored::new("f", 4096, Tier::Nvme, Some(&nv)).unwrap();
    write(&mut t, &nv, &v1);
    // Directories where the write's spare must go: the write cannot start.
    block_spares(dir.path());
    t.page_in_zeroed(Some(&nv));
    t.data_mut().bytes_mut().fill(0xee);
    let err = t.page_out(Some(&nv), true).unwrap_err().to_string();
    assert!(err.contains("writing shard") && err.contains("f.rank0.bin") && err.contains(SPARE_PREFIX), "{err}");
    assert!(read(&mut t, &nv).unwrap() == v1, "the old state survives the failed write");
}

#[test]
fn damaged_data_and_footers_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme(dir.path());
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
        assert!(err.contains("d.rank0.bin") && words.iter().all(|w| err.contains(w)), "byte {at}: {err}");
    }
    // Same file size, another length: a file written for another model.
    write(&mut t, &nv, &pattern(len, 1));
    let mut other = Stored::new("d", len + 100, Tier::Nvme, Some(&nv)).unwrap();
    let err = read(&mut other, &nv).unwrap_err();
    assert!(err.contains("holds 6000 bytes, expected 6100") && err.contains("another model"), "{err}");
}

#[test]
fn without_verification_no_checksum_is_written_and_a_verifying_run_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = pattern(4096, 9);
    {
        let nv = nvme_with(dir.path(), IoEngineKind::Pread, false);
        let mut t = Stored::new("n", 4096, Tier::Nvme, Some(&nv)).unwrap();
        write(&mut t, &nv, &v1);
        assert!(read(&mut t, &nv).unwrap() == v1);
    }
    let nv = nvme(dir.path());
    let mut t = Stored::new("n", 4096, Tier::Nvme, Some(&nv)).unwrap();
    let err = read(&mut t, &nv).unwrap_err();
    assert!(err.contains("n.rank0.bin") && err.contains("without a checksum"), "{err}");
}

#[test]
fn a_symlink_where_a_shard_should_be_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let nv = nvme(dir.path());
    let target = elsewhere.path().join("precious");
    std::fs::write(&target, b"precious").unwrap();
    let path = nv.shard_path("s");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let err = Stored::new("s", 4096, Tier::Nvme, Some(&nv)).err().unwrap().to_string();
    assert!(err.contains(&*path.to_string_lossy()) && err.contains("symlinks") && err.contains("not followed"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    // A dangling link is refused too, and its target is not created.
    let missing = elsewhere.path().join("missing");
    std::os::unix::fs::symlink(&missing, nv.shard_path("t")).unwrap();
    let err = Stored::new("t", 4096, Tier::Nvme, Some(&nv)).err().unwrap().to_string();
    assert!(err.contains("t.rank0.bin") && err.contains("not followed"), "{err}");
    assert!(!missing.exists());
}

#[test]
fn a_symlink_planted_as_the_next_file_or_the_shard_is_replaced_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let nv = nvme(dir.path());
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
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    assert!(read(&mut t, &nv).unwrap() == pattern(4096, 2));
}

#[test]
fn the_lock_file_as_a_symlink_is_refused() {
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

/// The child side of the test below: rewrites one shard alone and two more in one batch (on the
/// io_uring engine), every byte `k` in version `k`, until killed.
fn write_versions_until_killed(dir: &Path) -> ! {
    let nv = nvme(dir);
    let batched = nvme_with(&dir.join("batched"), IoEngineKind::Uring, true);
    let mut t = Stored::new("k", KILLED_BYTES, Tier::Nvme, Some(&nv)).unwrap();
    let (mut a, mut b) = (batch_member(&batched, "a"), batch_member(&batched, "b"));
    for k in 1u8.. {
        write(&mut t, &nv, &vec![k; KILLED_BYTES]);
        for s in [&mut a, &mut b] {
            s.page_in_zeroed(Some(&batched));
            s.data_mut().bytes_mut().fill(k);
        }
        Stored::page_out_all(&mut [&mut a, &mut b], Some(&batched), true).unwrap();
    }
    unreachable!("256 versions written before the kill");
}

const KILLED_BYTES: usize = 8 << 20;

fn batch_member(nv: &NvmeDir, name: &str) -> Stored {
    Stored::new(name, KILLED_BYTES, Tier::Nvme, Some(nv)).unwrap()
}

#[test]
fn a_process_killed_mid_write_leaves_one_whole_version() {
    if let Some(dir) = std::env::var_os("ZEROSTREAM_TEST_KILL_DIR") {
        write_versions_until_killed(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    {
        let nv = nvme(dir.path());
        write(&mut Stored::new("k", KILLED_BYTES, Tier::Nvme, Some(&nv)).unwrap(), &nv, &vec![0; KILLED_BYTES]);
        let batched = nvme_with(&dir.path().join("batched"), IoEngineKind::Uring, true);
        for name in ["a", "b"] {
            write(&mut batch_member(&batched, name), &batched, &vec![0; KILLED_BYTES]);
        }
    }
    let path = dir.path().join("k.rank0.bin");
    // Later kills land mid-batch too (the child needs ~100 ms to start writing).
    for delay_ms in [5, 20, 45, 80, 130, 210, 340] {
        // This test again, in a child process that finds the variable set.
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_process_killed_mid_write_leaves_one_whole_version", "--test-threads=1", "--quiet"])
            .env("ZEROSTREAM_TEST_KILL_DIR", dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let leftover = spares(dir.path()).len() + spares(&dir.path().join("batched")).len();
        // The child's lock went with it; reopening removes the spares and reads a whole version.
        let nv = nvme(dir.path());
        assert!(spares(dir.path()).is_empty() && !next_of(&path).exists());
        let mut t = Stored::new("k", KILLED_BYTES, Tier::Nvme, Some(&nv)).unwrap();
        let back = read(&mut t, &nv).unwrap_or_else(|e| panic!("killed after {delay_ms} ms (spares left: {leftover}): {e}"));
        assert!(back.iter().all(|&b| b == back[0]), "killed after {delay_ms} ms: a mix of versions");
        let batched = nvme_with(&dir.path().join("batched"), IoEngineKind::Uring, true);
        assert!(spares(&dir.path().join("batched")).is_empty());
        let versions: Vec<u8> = ["a", "b"]
            .iter()
            .map(|name| {
                let back = read(&mut batch_member(&batched, name), &batched).unwrap_or_else(|e| panic!("killed after {delay_ms} ms: {e}"));
                assert!(back.iter().all(|&b| b == back[0]), "killed after {delay_ms} ms: a mix of versions in batched {name}");
                back[0]
            })
            .collect();
        eprintln!("killed after {delay_ms} ms: version {} reads back ({versions:?} batched), spares left: {leftover}", back[0]);
    }
}

#[test]
fn a_batch_pages_tensors_of_both_tiers_in_and_out_together() {
    for engine in [IoEngineKind::Uring, IoEngineKind::Pread, IoEngineKind::Mmap] {
        let dir = tempfile::tempdir().unwrap();
        let nv = nvme_with(dir.path(), engine, true);
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
        assert!(all.iter().enumerate().all(|(k, t)| t.is_resident() == (k == 2)), "{engine}: NVMe tensors paged out, RAM kept");
        assert_eq!(nv.traffic(), (0, (lens[0] + lens[1] + lens[3]) as u64), "{engine}: bytes written");
        all[3].page_in(Some(&nv)).unwrap();
        Stored::page_in_all(&mut all, Some(&nv)).unwrap();
        for (k, t) in all.iter().enumerate() {
            assert!(t.data().bytes() == pattern(lens[k], k as u8), "{engine}: tensor {k} after the round trip");
        }
        // Read once each: the batch skipped the tensor already resident.
        assert_eq!(nv.traffic().0, (lens[0] + lens[1] + lens[3]) as u64, "{engine}: bytes read");
    }
}

#[test]
fn a_batch_names_the_damaged_shard_and_leaves_nothing_half_paged_in() {
    let dir = tempfile::tempdir().unwrap();
    let nv = nvme_with(dir.path(), IoEngineKind::Uring, true);
    let len = 3 * 4096;
    let mut tensors: Vec<Stored> = (0..3).map(|k| Stored::new(&format!("c{k}"), len, Tier::Nvme, Some(&nv)).unwrap()).collect();
    for (k, t) in tensors.iter_mut().enumerate() {
        write(t, &nv, &pattern(len, k as u8));
    }
    flip(&nv.shard_path("c1"), 5000);
    let mut all: Vec<&mut Stored> = tensors.iter_mut().collect();
    let err = Stored::page_in_all(&mut all, Some(&nv)).unwrap_err().to_string();
    assert!(err.contains("c1.rank0.bin") && err.contains("checksum mismatch"), "{err}");
    assert!(all.iter().all(|t| !t.is_resident()), "no tensor of a failed batch is resident");
    // A write that cannot start for the last tensor: no tensor of the batch is written, and every
    // buffer leaves.
    // Written in one batch, the three leave three idle spares: they serve the first three of four
    // below; the last must create one, and cannot.
    for (k, t) in all.iter_mut().enumerate() {
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().copy_from_slice(&pattern(len, k as u8));
    }
    Stored::page_out_all(&mut all, Some(&nv), true).unwrap();
    let mut fourth = Stored::new("c3", len, Tier::Nvme, Some(&nv)).unwrap();
    all.push(&mut fourth);
    let idle = spares(dir.path());
    assert_eq!(idle.len(), 3, "{idle:?}");
    (idle.len()..256).for_each(|n| std::fs::create_dir_all(dir.path().join(format!("{SPARE_PREFIX}{n}/blocker"))).unwrap());
    for t in all.iter_mut() {
        t.page_in_zeroed(Some(&nv));
        t.data_mut().bytes_mut().fill(0xee);
    }
    let err = Stored::page_out_all(&mut all, Some(&nv), true).unwrap_err().to_string();
    assert!(err.contains("c3.rank0.bin") && err.contains(SPARE_PREFIX), "{err}");
    let err = read(all[3], &nv).unwrap_err();
    assert!(err.contains("never completely written"), "c3 was never written: {err}");
    all.pop();
    assert!(all.iter().all(|t| !t.is_resident()));
    assert!(read(all[2], &nv).unwrap() == pattern(len, 2), "the failed tensor's old state survives");
    for (k, t) in all.iter_mut().take(2).enumerate() {
        assert!(read(t, &nv).unwrap() == pattern(len, k as u8), "tensor {k}: nothing written when the batch cannot start");
    }
}
