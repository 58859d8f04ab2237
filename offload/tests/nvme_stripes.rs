//! The NVMe tier striped over several directories (`--nvme-dir A,B,...`): every tensor is cut into
//! page-aligned stripes, one shard file per directory, moved in one batch; what is written reads back
//! whole through every I/O engine and install; each directory holds an equal share of every tensor
//! (within a page); a corrupt stripe is named by its path; and the directories are refused by name
//! when given twice, in use by another run, or not directories.

mod common;

use std::path::{Path, PathBuf};

use common::{FOOTER, Setup, read, setups, write};
use zerostream_offload::store::stripe_ranges;
use zerostream_offload::{IoConfig, IoEngine, NvmeDir, Stored, Tier};

fn striped(dirs: &[PathBuf], setup: Setup, verify: bool) -> NvmeDir {
    let io = IoEngine::new(IoConfig { engine: setup.engine, block_bytes: 8192, queue_depth: 4, ..IoConfig::default() }).unwrap();
    let mut nv = NvmeDir::striped(dirs, io, verify, 0).unwrap();
    nv.atomic_exchange = setup.exchange;
    nv
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed).collect()
}

/// Data bytes (file size less the footer) of every shard file in `dir`.
fn data_bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".bin"))
        .map(|e| e.metadata().unwrap().len() - FOOTER as u64)
        .sum()
}

/// Data bytes of the shard files of every tensor but `t{big}`.
fn data_of_small(nv: &NvmeDir, big: usize) -> u64 {
    (0..SIZES.len())
        .filter(|&k| k != big)
        .flat_map(|k| (0..nv.stripe_count()).map(move |s| (k, s)))
        .filter_map(|(k, s)| std::fs::metadata(nv.stripe_path(s, &format!("t{k}"))).ok())
        .map(|m| m.len() - FOOTER as u64)
        .sum()
}

const SIZES: [usize; 7] = [1, 4095, 4096, 10_000, 3 * 4096 + 5, 65_536, (1 << 20) + 7];

#[test]
fn stripes_cover_the_tensor_in_page_aligned_pieces_of_equal_size() {
    for stripes in 1..=4 {
        for len in SIZES.into_iter().chain([0, 5 * 4096]) {
            let ranges = stripe_ranges(len, stripes);
            assert_eq!(ranges.first().unwrap().start, 0, "{len} over {stripes}");
            assert_eq!(ranges.last().unwrap().end, len, "{len} over {stripes}");
            assert!(ranges.len() <= stripes && (len == 0 || ranges.iter().all(|r| !r.is_empty())), "{len}: {ranges:?}");
            for w in ranges.windows(2) {
                assert_eq!(w[0].end, w[1].start, "{len} over {stripes}: contiguous");
                assert_eq!(w[0].start % 4096, 0, "{len} over {stripes}: page-aligned");
            }
            let (most, least) = (ranges.iter().map(|r| r.len()).max().unwrap(), ranges.iter().map(|r| r.len()).min().unwrap());
            if ranges.len() == stripes {
                assert!(most - least <= 4096 * stripes, "{len} over {stripes}: {ranges:?}");
            }
        }
    }
}

#[test]
fn striped_tensors_round_trip_through_every_engine_and_install() {
    for setup in setups() {
        for count in [2, 3] {
            let root = tempfile::tempdir().unwrap();
            let dirs: Vec<PathBuf> = (0..count).map(|k| root.path().join(format!("drive{k}"))).collect();
            let nv = striped(&dirs, setup, true);
            assert_eq!(nv.stripe_count(), count);
            let mut tensors: Vec<Stored> =
                SIZES.iter().enumerate().map(|(k, &len)| Stored::new(&format!("t{k}"), len, Tier::Nvme, Some(&nv)).unwrap()).collect();
            for (k, t) in tensors.iter_mut().enumerate() {
                write(t, &nv, &pattern(SIZES[k], k as u8));
            }
            // Twice: the second write goes into the spares the first left, in each directory's pool.
            for (k, t) in tensors.iter_mut().enumerate() {
                write(t, &nv, &pattern(SIZES[k], 100 + k as u8));
            }
            // One batch pages every tensor in at once: every stripe of every tensor in one stream.
            let mut all: Vec<&mut Stored> = tensors.iter_mut().collect();
            Stored::page_in_all(&mut all, Some(&nv)).unwrap();
            for (k, t) in tensors.iter().enumerate() {
                assert!(
                    t.data().bytes() == pattern(SIZES[k], 100 + k as u8).as_slice(),
                    "{setup}, {count} dirs: t{k} ({} bytes)",
                    SIZES[k]
                );
            }
            let mut all: Vec<&mut Stored> = tensors.iter_mut().collect();
            Stored::page_out_all(&mut all, Some(&nv), false).unwrap();
            // Each tensor's bytes counted once, however many stripes carried them.
            let total: u64 = SIZES.iter().map(|&l| l as u64).sum();
            assert_eq!(nv.traffic(), (total, 2 * total), "{setup}, {count} dirs");
            // Each directory holds its share: the large tensor's stripes are equal within a page.
            let big = SIZES.len() - 1;
            let shares: Vec<u64> =
                (0..count).map(|k| std::fs::metadata(nv.stripe_path(k, &format!("t{big}"))).unwrap().len() - FOOTER as u64).collect();
            assert!(shares.iter().all(|s| s.abs_diff(shares[0]) <= 4096), "{setup}: shares {shares:?}");
            assert_eq!(shares.iter().sum::<u64>(), dirs.iter().map(|d| data_bytes_in(d)).sum::<u64>() - data_of_small(&nv, big));
        }
    }
}

#[test]
fn a_corrupt_stripe_is_named_by_its_path() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![root.path().join("a"), root.path().join("b")];
    let nv = striped(&dirs, setups()[0], true);
    let len = 10 * 4096 + 100;
    let mut t = Stored::new("w", len, Tier::Nvme, Some(&nv)).unwrap();
    write(&mut t, &nv, &pattern(len, 9));
    let second = nv.stripe_path(1, "w");
    assert!(second.starts_with(&dirs[1]), "{}", second.display());
    let mut bytes = std::fs::read(&second).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&second, bytes).unwrap();
    let err = read(&mut t, &nv).unwrap_err();
    assert!(err.contains("checksum mismatch") && err.contains(&*second.to_string_lossy()), "{err}");
    // Another stripe count finds files of other sizes, an earlier run's scratch: sized anew, and
    // they hold what is written.
    drop(t);
    drop(nv);
    let three = vec![dirs[0].clone(), dirs[1].clone(), root.path().join("c")];
    let nv = striped(&three, setups()[0], true);
    let mut t = Stored::new("w", len, Tier::Nvme, Some(&nv)).unwrap();
    write(&mut t, &nv, &pattern(len, 4));
    assert_eq!(read(&mut t, &nv).unwrap(), pattern(len, 4));
}

#[test]
fn directories_given_twice_in_use_or_not_directories_are_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    let io = || IoEngine::new(IoConfig::default()).unwrap();
    let err = NvmeDir::striped(&[a.clone(), b.clone(), a.join("..").join("a")], io(), true, 0).unwrap_err().to_string();
    assert!(err.contains("given twice"), "{err}");
    let held = NvmeDir::new(&b, io(), true, 0).unwrap();
    let err = NvmeDir::striped(&[a.clone(), b.clone()], io(), true, 0).unwrap_err().to_string();
    assert!(err.contains("in use by another zerostream run") && err.contains(&*b.to_string_lossy()), "{err}");
    drop(held);
    let file = root.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = NvmeDir::striped(&[a.clone(), file.clone()], io(), true, 0).unwrap_err().to_string();
    assert!(err.contains(&*file.to_string_lossy()), "{err}");
    let err = NvmeDir::striped(&[], io(), true, 0).unwrap_err().to_string();
    assert!(err.contains("--nvme-dir"), "{err}");
    // Refusals leave no lock behind: the directories open again.
    NvmeDir::striped(&[a, b], io(), true, 0).unwrap();
}
