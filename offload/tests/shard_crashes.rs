//! What a crash leaves on the NVMe tier: a process killed at any instant of a write (one shard alone,
//! or several in one batch) leaves one whole version of each shard, under every streaming engine and
//! both installs; and each state the portable install (no atomic exchange: a hard link, then a rename
//! over the shard) can be stopped in reads back as the old version or the new one, never a mix, with
//! the leftovers removed when the directory is next opened.

mod common;

use std::path::Path;

use common::{FOOTER, Setup, nvme_in, read, spares, streaming, write};
use zerostream_offload::{IoEngineKind, NvmeDir, SPARE_PREFIX, Stored, Tier};

const KILLED_BYTES: usize = 8 << 20;

fn member(nv: &NvmeDir, name: &str, len: usize) -> Stored {
    Stored::new(name, len, Tier::Nvme, Some(nv)).unwrap()
}

/// The child side of the test below: rewrites one shard alone and two more in one batch, every byte
/// `k` in version `k`, until killed.
fn write_versions_until_killed(dir: &Path, setup: Setup) -> ! {
    let nv = nvme_in(dir, setup, true);
    let batched = nvme_in(&dir.join("batched"), setup, true);
    let mut t = member(&nv, "k", KILLED_BYTES);
    let (mut a, mut b) = (member(&batched, "a", KILLED_BYTES), member(&batched, "b", KILLED_BYTES));
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

/// Reads shard `name` back through a fresh directory and checks it is one version throughout.
fn one_version(nv: &NvmeDir, name: &str, what: &str) -> u8 {
    let back = read(&mut member(nv, name, KILLED_BYTES), nv).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(back.iter().all(|&b| b == back[0]), "{what}: a mix of versions in {name}");
    back[0]
}

#[test]
fn a_process_killed_mid_write_leaves_one_whole_version() {
    if let (Some(dir), Some(setup)) = (std::env::var_os("ZEROSTREAM_TEST_KILL_DIR"), std::env::var_os("ZEROSTREAM_TEST_KILL_SETUP")) {
        write_versions_until_killed(Path::new(&dir), Setup::from_arg(&setup.to_string_lossy()));
    }
    for setup in streaming() {
        let dir = tempfile::tempdir().unwrap();
        {
            let nv = nvme_in(dir.path(), setup, true);
            write(&mut member(&nv, "k", KILLED_BYTES), &nv, &vec![0; KILLED_BYTES]);
            let batched = nvme_in(&dir.path().join("batched"), setup, true);
            for name in ["a", "b"] {
                write(&mut member(&batched, name, KILLED_BYTES), &batched, &vec![0; KILLED_BYTES]);
            }
        }
        // Later kills land mid-batch too (the child needs ~100 ms to start writing).
        for delay_ms in [5, 20, 45, 80, 130, 210, 340] {
            // This test again, in a child process that finds the variables set.
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "a_process_killed_mid_write_leaves_one_whole_version", "--test-threads=1", "--quiet"])
                .env("ZEROSTREAM_TEST_KILL_DIR", dir.path())
                .env("ZEROSTREAM_TEST_KILL_SETUP", setup.to_arg())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            child.kill().unwrap(); // SIGKILL (TerminateProcess on Windows)
            child.wait().unwrap();
            let leftover = spares(dir.path()).len() + spares(&dir.path().join("batched")).len();
            // The child's lock went with it; reopening removes the spares and reads a whole version.
            let what = format!("{setup}, killed after {delay_ms} ms (spares left: {leftover})");
            let nv = nvme_in(dir.path(), setup, true);
            assert!(spares(dir.path()).is_empty(), "{what}");
            let alone = one_version(&nv, "k", &what);
            let batched = nvme_in(&dir.path().join("batched"), setup, true);
            assert!(spares(&dir.path().join("batched")).is_empty(), "{what}");
            let versions = ["a", "b"].map(|name| one_version(&batched, name, &what));
            eprintln!("{what}: version {alone} reads back ({versions:?} batched)");
        }
    }
}

/// The steps of the portable install that a crash can stop after.
#[derive(Clone, Copy, Debug)]
enum Stopped {
    /// The new version written into a spare; nothing renamed.
    BeforeLink,
    /// Step 1 done: the shard's file also has a spare's name.
    AfterLink,
    /// Step 2 done: the spare renamed over the shard; the old file only under the spare's name.
    AfterRename,
}

/// Lays out `dir` as a portable install of `new` over the shard `name` (holding `old`) leaves it
/// when stopped at `stopped`, with the same calls the install makes (a hard link, a rename over).
fn crash_state(dir: &Path, name: &str, new_file: &[u8], stopped: Stopped) {
    let shard = dir.join(format!("{name}.rank0.bin"));
    let (written, kept) = (dir.join(format!("{SPARE_PREFIX}900")), dir.join(format!("{SPARE_PREFIX}901")));
    std::fs::write(&written, new_file).unwrap();
    if matches!(stopped, Stopped::AfterLink | Stopped::AfterRename) {
        std::fs::hard_link(&shard, &kept).unwrap();
    }
    if matches!(stopped, Stopped::AfterRename) {
        std::fs::rename(&written, &shard).unwrap();
    }
}

#[test]
fn a_crash_between_the_steps_of_the_portable_install_leaves_a_whole_version() {
    let len = 3 * 4096 + 77;
    let (old, new) = (vec![1u8; len], vec![2u8; len]);
    // A whole shard file holding `new`, as the install's spare would: written by the store elsewhere.
    let elsewhere = tempfile::tempdir().unwrap();
    let new_file = {
        let nv = nvme_in(elsewhere.path(), Setup { engine: IoEngineKind::Threads, exchange: false }, true);
        write(&mut member(&nv, "s", len), &nv, &new);
        std::fs::read(nv.shard_path("s")).unwrap()
    };
    assert_eq!(new_file.len(), 4 * 4096 + FOOTER);
    for (stopped, want) in [(Stopped::BeforeLink, &old), (Stopped::AfterLink, &old), (Stopped::AfterRename, &new)] {
        let dir = tempfile::tempdir().unwrap();
        {
            let nv = nvme_in(dir.path(), Setup { engine: IoEngineKind::Threads, exchange: false }, true);
            write(&mut member(&nv, "s", len), &nv, &old);
        }
        crash_state(dir.path(), "s", &new_file, stopped);
        assert!(!spares(dir.path()).is_empty(), "{stopped:?}: the crash left spares");
        // The next run: the spares go (a name of the shard's file among them), the shard reads whole.
        let nv = nvme_in(dir.path(), Setup { engine: IoEngineKind::Threads, exchange: false }, true);
        assert!(spares(dir.path()).is_empty(), "{stopped:?}: leftovers removed on open");
        let mut t = member(&nv, "s", len);
        assert!(read(&mut t, &nv).unwrap() == *want, "{stopped:?}: the shard reads back the version it named");
        // And it is written on as ever.
        write(&mut t, &nv, &vec![3; len]);
        assert!(read(&mut t, &nv).unwrap() == vec![3; len], "{stopped:?}: written after the crash");
    }
}
