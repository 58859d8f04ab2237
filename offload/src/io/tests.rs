//! The engines against each other: every one moves the same bytes, in batches and repeated, and
//! names short reads by segment; the streaming engines (io_uring and threads) run the same checks.

use super::*;
use crate::aligned::AlignedBuf;

/// The engines that move a batch as one stream of requests.
const STREAMING: [IoEngineKind; 2] = [IoEngineKind::Uring, IoEngineKind::Threads];

#[test]
fn every_engine_round_trips_bytes_at_odd_block_counts() {
    let dir = tempfile::tempdir().unwrap();
    for engine in IoEngineKind::ALL {
        let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 3, direct: true }).unwrap();
        let path = dir.path().join(format!("f-{engine}"));
        let (file, _) = io.open(&path, true).unwrap();
        let len = 5 * 8192 + 4096; // 5 whole blocks and a partial one
        file.set_len(len as u64 + 4096).unwrap();
        let mut out = AlignedBuf::zeroed(len);
        for (i, b) in out.bytes_mut().iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        io.transfer(Direction::Write, &file, 4096, out.padded_mut()).unwrap();
        let mut back = AlignedBuf::zeroed(len);
        io.transfer(Direction::Read, &file, 4096, back.padded_mut()).unwrap();
        assert!(out.bytes() == back.bytes(), "{engine}: bytes differ after a round trip");
    }
}

#[test]
fn a_read_past_the_end_is_a_short_read_error() {
    let dir = tempfile::tempdir().unwrap();
    for engine in STREAMING {
        let io = IoEngine::new(IoConfig { engine, block_bytes: 4096, queue_depth: 2, direct: true }).unwrap();
        let (file, _) = io.open(&dir.path().join("short"), true).unwrap();
        file.set_len(4096).unwrap();
        let mut buf = AlignedBuf::zeroed(3 * 4096);
        let err = io.transfer(Direction::Read, &file, 0, buf.padded_mut()).unwrap_err();
        assert!(err.to_string().contains("short read"), "{engine}: {err}");
    }
}

#[test]
fn a_repeated_transfer_streams_the_buffer_over_the_whole_range() {
    let dir = tempfile::tempdir().unwrap();
    for engine in STREAMING {
        let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 4, direct: true }).unwrap();
        let (file, _) = io.open(&dir.path().join(format!("r-{engine}")), true).unwrap();
        let (chunk, repeats) = (3 * 8192, 5u64);
        preallocate(&file, 4096 + chunk as u64 * repeats).unwrap();
        let mut out = AlignedBuf::zeroed(chunk);
        for (i, b) in out.bytes_mut().iter_mut().enumerate() {
            *b = (i * 13 % 251) as u8;
        }
        io.transfer_repeated(Direction::Write, &file, 4096, out.padded_mut(), chunk as u64 * repeats).unwrap();
        let mut whole = AlignedBuf::zeroed(chunk * repeats as usize);
        io.transfer(Direction::Read, &file, 4096, whole.padded_mut()).unwrap();
        for (k, copy) in whole.bytes().chunks(chunk).enumerate() {
            assert!(copy == out.bytes(), "{engine}: repeat {k} differs");
        }
        let mut back = AlignedBuf::zeroed(chunk);
        io.transfer_repeated(Direction::Read, &file, 4096, back.padded_mut(), chunk as u64 * repeats).unwrap();
        assert!(back.bytes() == out.bytes(), "{engine}: repeated read");
        let err = io.transfer_repeated(Direction::Read, &file, 0, back.padded_mut(), chunk as u64 + 8192).unwrap_err();
        assert!(err.to_string().contains("multiple of the buffer"), "{err}");
    }
}

#[test]
fn a_batch_moves_every_segment_and_checksums_what_it_moved() {
    let dir = tempfile::tempdir().unwrap();
    for engine in IoEngineKind::ALL {
        // Depth 3 with 2-page blocks: the queue spans segment boundaries.
        let io = IoEngine::new(IoConfig { engine, block_bytes: 8192, queue_depth: 3, direct: true }).unwrap();
        // Awkward sizes (a page, blocks and a partial one, empty), two segments in one file.
        let lens = [4096usize, 5 * 8192 + 4096, 0, 3 * 4096, 8192];
        let offsets = [0u64, 0, 0, 8192, 0];
        let which_file = [0usize, 1, 2, 0, 3];
        let files: Vec<File> = (0..4).map(|f| io.open(&dir.path().join(format!("{engine}-{f}")), true).unwrap().0).collect();
        files.iter().for_each(|f| preallocate(f, 64 * 4096).unwrap());
        let mut out: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::zeroed(n)).collect();
        for (k, b) in out.iter_mut().enumerate() {
            b.bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i * 7 + k * 31) as u8);
        }
        // Checksums over less than the buffer (what a shard does: its unpadded length).
        let hash_lens: Vec<usize> = lens.iter().map(|&n| n.saturating_sub(100)).collect();
        // One batch over all the buffers in `direction`; returns each segment's checksum.
        let transfer = |direction: Direction, bufs: &mut [AlignedBuf]| -> Vec<crc32fast::Hasher> {
            let mut hashers: Vec<crc32fast::Hasher> = lens.iter().map(|_| crc32fast::Hasher::new()).collect();
            let mut segments: Vec<Segment<'_>> = bufs
                .iter_mut()
                .zip(hashers.iter_mut())
                .enumerate()
                .map(|(k, (b, h))| Segment {
                    file: &files[which_file[k]],
                    offset: offsets[k],
                    buf: b.padded_mut(),
                    checksum: Some((h, hash_lens[k])),
                })
                .collect();
            io.transfer_batch(direction, &mut segments).unwrap();
            drop(segments);
            hashers
        };
        let written = transfer(Direction::Write, &mut out);
        let mut back: Vec<AlignedBuf> = lens.iter().map(|&n| AlignedBuf::zeroed(n)).collect();
        let read = transfer(Direction::Read, &mut back);
        for k in 0..lens.len() {
            assert!(back[k].bytes() == out[k].bytes(), "{engine}: segment {k} round trip");
            let want = crc32fast::hash(&out[k].bytes()[..hash_lens[k]]);
            assert_eq!(written[k].clone().finalize(), want, "{engine}: segment {k}'s checksum on the way out");
            assert_eq!(read[k].clone().finalize(), want, "{engine}: segment {k}'s checksum on the way in");
        }
        // A short read in the third segment is named by its index (mmap cannot tell: it faults).
        if engine == IoEngineKind::Mmap {
            continue;
        }
        let short_file = io.open(&dir.path().join(format!("{engine}-short")), true).unwrap().0;
        short_file.set_len(4096).unwrap();
        let mut bufs = [AlignedBuf::zeroed(8192), AlignedBuf::zeroed(8192), AlignedBuf::zeroed(2 * 8192)];
        let [a, b, c] = &mut bufs;
        let mut segments = [
            Segment { file: &files[0], offset: 0, buf: a.padded_mut(), checksum: None },
            Segment { file: &files[1], offset: 0, buf: b.padded_mut(), checksum: None },
            Segment { file: &short_file, offset: 0, buf: c.padded_mut(), checksum: None },
        ];
        let err = io.transfer_batch(Direction::Read, &mut segments).unwrap_err();
        assert_eq!(err.segment, 2, "{engine}: {}", err.error);
        assert!(err.error.to_string().contains("short read"), "{engine}: {}", err.error);
    }
}

#[test]
fn bad_block_sizes_and_depths_are_refused() {
    let bad = IoEngine::new(IoConfig { block_bytes: 1000, ..IoConfig::default() }).unwrap_err();
    assert!(bad.to_string().contains("multiple of 4096"), "{bad}");
    let bad = IoEngine::new(IoConfig { queue_depth: 0, ..IoConfig::default() }).unwrap_err();
    assert!(bad.to_string().contains("queue depth"), "{bad}");
}

#[test]
fn the_threads_engine_serves_several_submitting_threads_at_any_depth() {
    let dir = tempfile::tempdir().unwrap();
    // Depth 1 (one worker), an odd depth, and one deeper than the pool's worker limit.
    std::thread::scope(|scope| {
        for (t, depth) in [1usize, 7, 300].into_iter().enumerate() {
            let dir = dir.path();
            scope.spawn(move || {
                let io =
                    IoEngine::new(IoConfig { engine: IoEngineKind::Threads, block_bytes: 4096, queue_depth: depth, direct: true }).unwrap();
                let (file, _) = io.open(&dir.join(format!("t{t}")), true).unwrap();
                preallocate(&file, 64 * 4096).unwrap();
                for round in 0..5u8 {
                    let mut out = AlignedBuf::zeroed(37 * 4096);
                    out.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = (i as u8).wrapping_mul(3) ^ round ^ t as u8);
                    io.transfer(Direction::Write, &file, 8192, out.padded_mut()).unwrap();
                    let mut back = AlignedBuf::zeroed(37 * 4096);
                    io.transfer(Direction::Read, &file, 8192, back.padded_mut()).unwrap();
                    assert!(back.bytes() == out.bytes(), "depth {depth}, round {round}");
                }
            });
        }
    });
}

#[test]
fn engines_are_named_the_threads_one_also_by_its_old_name() {
    for engine in IoEngineKind::ALL {
        assert_eq!(engine.name().parse::<IoEngineKind>().unwrap(), engine);
    }
    assert_eq!("pread".parse::<IoEngineKind>().unwrap(), IoEngineKind::Threads, "a resumed run's recorded setting");
    let err = "aio".parse::<IoEngineKind>().unwrap_err();
    assert!(err.contains("uring, threads or mmap"), "{err}");
    assert_eq!(IoConfig::default().engine, IoEngineKind::NATIVE);
    let native = if cfg!(target_os = "linux") { IoEngineKind::Uring } else { IoEngineKind::Threads };
    assert_eq!(IoEngineKind::NATIVE, native);
    // The threads engine is never swapped for another.
    let io = IoEngine::new(IoConfig { engine: IoEngineKind::Threads, ..IoConfig::default() }).unwrap();
    assert_eq!((io.config.engine, io.notes.len()), (IoEngineKind::Threads, 0));
}
