//! The pipelined sweep over shards stored on the NVMe tier: every byte written by the computation of
//! one sweep comes back, checksummed, in the next — for each I/O engine and both installs.

mod common;

use common::setups;
use zerostream_offload::{IoConfig, IoEngine, NvmeDir, StoreError, Stored, Tier, pipelined_sweep};

/// FNV-1a over the shard: a checksum the test computes itself, independent of the store's CRC.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

#[test]
fn every_byte_round_trips_through_two_sweeps() {
    for setup in setups() {
        let dir = tempfile::tempdir().unwrap();
        let io = IoEngine::new(IoConfig { engine: setup.engine, block_bytes: 16384, queue_depth: 4, ..IoConfig::default() }).unwrap();
        assert_eq!(io.config.engine, setup.engine, "{setup}: {:?}", io.notes);
        let mut nvme = NvmeDir::new(dir.path(), io, true, 3).unwrap();
        nvme.atomic_exchange = setup.exchange;
        let engine = setup;
        // Awkward sizes: below a page, a page and a bit, several blocks and a partial one.
        let sizes = [100usize, 4097, 70_001, 16384 * 3 + 12, 1];
        let mut shards: Vec<Stored> =
            sizes.iter().enumerate().map(|(k, &n)| Stored::new(&format!("s{k}"), n, Tier::Nvme, Some(&nvme)).unwrap()).collect();
        for (k, s) in shards.iter_mut().enumerate() {
            s.page_in_zeroed(Some(&nvme));
            for (i, b) in s.data_mut().bytes_mut().iter_mut().enumerate() {
                *b = (i * 31 + k * 7) as u8;
            }
            s.page_out(Some(&nvme), true).unwrap();
        }
        let load = |s: &mut Stored| -> Result<(), StoreError> { s.page_in(Some(&nvme)) };
        let store = |s: &mut Stored| -> Result<(), StoreError> { s.page_out(Some(&nvme), true) };
        // Sweep 1: check what was written, then overwrite every byte and remember the checksums.
        let mut sums = vec![0u64; sizes.len()];
        let shards = pipelined_sweep(
            shards,
            load,
            |k, s| {
                assert!(
                    s.data().bytes().iter().enumerate().all(|(i, &b)| b == (i * 31 + k * 7) as u8),
                    "{engine}: shard {k} before the sweep"
                );
                for (i, b) in s.data_mut().bytes_mut().iter_mut().enumerate() {
                    *b = (i * 13 + k * 101 + 5) as u8;
                }
                sums[k] = fnv(s.data().bytes());
                Ok(())
            },
            store,
        )
        .unwrap();
        assert!(shards.iter().all(|s| !s.is_resident()), "{engine}: the sweep pages every shard out");
        // Sweep 2: the checksums of what comes back match.
        let mut seen = vec![0u64; sizes.len()];
        pipelined_sweep(
            shards,
            load,
            |k, s| {
                seen[k] = fnv(s.data().bytes());
                Ok(())
            },
            store,
        )
        .unwrap();
        assert_eq!(seen, sums, "{engine}: checksums after the round trip");
        assert!(nvme.shard_path("s0").to_string_lossy().ends_with("s0.rank3.bin"));
    }
}
