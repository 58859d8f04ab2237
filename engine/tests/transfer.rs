//! Host<->device transfers of `bench h2d` / `bench d2h` / `bench overlap` move the right bytes (needs an
//! adapter); the cpu device's 16-bit upload equals the trait's widening, its twin.

mod common;

use zerostream::bench::transfer::{Link, bench_transfer};
use zerostream::device::ReadBack;

#[test]
fn device_to_host_transfers_return_the_uploaded_bytes() {
    let Some(gpu) = common::gpu_or_skip("device_to_host_transfers_return_the_uploaded_bytes") else { return };
    // bench_transfer checks every d2h result against the bytes it uploaded and fails on a difference;
    // 33 MiB + 4 bytes makes the d2h staging ring (4 buffers of 8 MiB) wrap, with a partial last chunk.
    // InPlace and Pinned are checked where the bytes land, after a first copy into the same buffer.
    let pinned = gpu.pinned_read_back_unavailable().is_none();
    let runs = bench_transfer(&gpu, Link::DeviceToHost, &[4, (33 << 20) + 4], 1, |_| {}).unwrap();
    assert_eq!(runs.len(), 2 * (3 + pinned as usize), "two sizes; Direct, StagingRing, InPlace and Pinned where the adapter has it");
    assert!(runs.iter().all(|r| r.gbps > 0.0 && r.gbps.is_finite()));
    let runs = bench_transfer(&gpu, Link::HostToDevice, &[(9 << 20) + 4], 1, |_| {}).unwrap();
    let host_memory = gpu.host_staging_unavailable().is_none();
    assert_eq!(
        runs.len(),
        4 + 2 * host_memory as usize,
        "Direct, Parallel, StagingRing, HostRing and Pinned where the adapter has them, Prestaged"
    );
    assert!(runs.iter().all(|r| r.gbps > 0.0 && r.gbps.is_finite()));
    let err = bench_transfer(&gpu, Link::HostToDevice, &[6], 1, |_| {}).unwrap_err().to_string();
    assert!(err.contains("multiple of 4"), "{err}");
}

/// The gpu device's writes: a large one goes through the upload ring (8 MiB chunks of 8 buffers,
/// each filled on several threads in 1 MiB pieces, the last ones partial; 80 MiB + 12 bytes wraps the
/// ring, so refills wait for their buffer's earlier copy), a small one through `write_buffer`; all read
/// back exactly, a write after queued work is ordered after it, and work queued after a write after
/// the write. With both kinds of staging where the adapter has them (lavapipe does: its host-visible
/// memory stands in for host memory), switched between writes.
#[test]
fn parallel_uploads_write_every_byte_in_order() {
    use zerostream::device::UploadStaging;
    let Some(gpu) = common::gpu_or_skip("parallel_uploads_write_every_byte_in_order") else { return };
    let mut kinds = vec![UploadStaging::Mapped];
    match gpu.host_staging_unavailable() {
        None => kinds.push(UploadStaging::Host),
        Some(why) => eprintln!("parallel_uploads_write_every_byte_in_order: no host-memory staging here ({why})"),
    }
    for kind in kinds {
        gpu.set_upload_staging(kind).unwrap();
        assert_eq!(gpu.upload_staging(), kind);
        write_every_byte_in_order(&gpu);
    }
    assert!(gpu.set_upload_staging(UploadStaging::Mapped).is_ok());
}

fn write_every_byte_in_order(gpu: &zerostream::device::GpuDevice) {
    use zerostream::Backend;
    for len in [5usize, (3 << 18) + 7, (1 << 20) + 3, (5 << 22) + 3] {
        let values: Vec<f32> = (0..len).map(|i| (i % 1009) as f32 - 500.5).collect();
        let t = gpu.alloc(len, "upload").unwrap();
        gpu.fill(&t, 1.0);
        gpu.write(&t, &values);
        assert!(gpu.read(&t) == values, "{len} elements: the read-back differs from what was written");
        // A fill queued before a second write must not land after it.
        gpu.fill(&t, 2.0);
        gpu.write(&t, &values);
        assert!(gpu.read(&t) == values, "{len} elements: a write was reordered before queued work");
        gpu.fill(&t, 3.0);
        assert!(gpu.read(&t).iter().all(|&v| v == 3.0), "{len} elements: a write landed after work queued behind it");
    }
    // Eight buffers to start; more only while writes outrun the device's copies, up to 64.
    assert!((8..=64).contains(&gpu.upload_ring_len()), "{} buffers in the upload ring", gpu.upload_ring_len());
}

/// `bench overlap` issues each upload method's copy, and the trainer's download, behind submitted
/// matmuls and checks the bytes that arrive (it fails on a difference); 72 MiB + 16 bytes wraps the
/// device's upload ring (8 buffers of 8 MiB), whose refills then wait for their own earlier copies
/// only. Bad sizes are refused by flag.
#[test]
fn copies_issued_behind_kernels_deliver_their_bytes() {
    use zerostream::bench::overlap::{OverlapConfig, bench_overlap};
    let Some(gpu) = common::gpu_or_skip("copies_issued_behind_kernels_deliver_their_bytes") else { return };
    let cfg = OverlapConfig { bytes: (72 << 20) + 16, m: 64, n: 48, k: 80, reps: 1 };
    let mut seen = 0;
    let runs = bench_overlap(&gpu, &cfg, |_| seen += 1).unwrap();
    let up = zerostream::bench::transfer::h2d_methods(&gpu, cfg.bytes).len();
    let queues = 2 * gpu.copy_queue_kinds().len();
    assert_eq!(
        (runs.len(), seen),
        (up + 1 + queues, up + 1 + queues),
        "every upload method, begin_read down, each copy queue's two, each reported"
    );
    assert_eq!(runs[up - 1].method, "h2d Prestaged");
    assert_eq!(runs[up].method, "d2h begin_read");
    for r in &runs {
        assert!([r.copy_s, r.kernels_s, r.both_s].iter().all(|s| *s > 0.0 && s.is_finite()), "{r:?}");
        assert!((1..=1000).contains(&r.matmuls) && r.hidden().is_finite(), "{r:?}");
        assert_eq!(r.to_json()["bytes"], cfg.bytes);
    }
    let err = bench_overlap(&gpu, &OverlapConfig { bytes: 20, ..cfg.clone() }, |_| {}).unwrap_err().to_string();
    assert!(err.contains("--bytes 20") && err.contains("multiple of 16"), "{err}");
    let err = bench_overlap(&gpu, &OverlapConfig { k: 0, ..cfg }, |_| {}).unwrap_err().to_string();
    assert!(err.contains("--k"), "{err}");
}

/// A device opened with copy queues (`gpu/copy_queue.rs`) has one on Vulkan, at least the stand-in
/// on wgpu's own queue (lavapipe has no other), and `bench overlap` times a copy each way on each,
/// checking the bytes on that queue (and on wgpu's, for a queue of its family); an empty copy, one of
/// part of a word, one out of a tensor's range, a host buffer of no whole words, and a queue the
/// device lacks are each refused by name; a host buffer's bytes wait for the copy into it. The
/// device trains as any other: the matmuls beside the copies run on it.
#[test]
fn copies_on_the_queues_beside_wgpus_deliver_their_bytes() {
    use zerostream::bench::overlap::{OverlapConfig, bench_overlap};
    use zerostream::device::gpu::CopyQueueKind;
    let test = "copies_on_the_queues_beside_wgpus_deliver_their_bytes";
    let Some(gpu) = common::gpu_or_skip(test) else { return };
    let kinds = gpu.copy_queue_kinds();
    if gpu.summary().backend != "Vulkan" {
        assert!(kinds.is_empty(), "{kinds:?} off Vulkan");
        eprintln!("SKIPPED {test}: copy queues are Vulkan's, and this adapter is {}", gpu.summary().backend);
        return;
    }
    assert!(!kinds.is_empty(), "a Vulkan device opened with copy queues has at least the stand-in");
    let cfg = OverlapConfig { bytes: (3 << 20) + 16, m: 64, n: 48, k: 80, reps: 1 };
    let runs = bench_overlap(&gpu, &cfg, |_| {}).unwrap();
    let queue_rows: Vec<&str> = runs.iter().map(|r| r.method.as_str()).filter(|m| kinds.iter().any(|k| m.ends_with(k.name()))).collect();
    let expected: Vec<String> = kinds.iter().flat_map(|k| [format!("h2d {}", k.name()), format!("d2h {}", k.name())]).collect();
    assert_eq!(queue_rows, expected);
    let mut host = gpu.host_buffer(4096).unwrap();
    let small = zerostream::device::Backend::alloc(&gpu, 256, "small").unwrap();
    // A queue of wgpu's family: `small` is written on wgpu's queue below, which a transfer-only
    // family's queue could not read without an ownership transfer.
    let same_family = *kinds.iter().find(|k| **k != CopyQueueKind::TransferFamily).expect("queue2 or the stand-in");
    let err = gpu.copy_host_to_tensor_on(same_family, &host, &small, 4096).unwrap_err().to_string();
    assert!(err.contains("4096 bytes") && err.contains("out of range"), "{err}");
    let missing = [CopyQueueKind::SameFamily, CopyQueueKind::TransferFamily, CopyQueueKind::SharedStandIn]
        .into_iter()
        .find(|k| !kinds.contains(k))
        .expect("a device has a second queue of wgpu's family or the stand-in, never both");
    let err = gpu.copy_tensor_to_host_on(missing, &small, &mut host, 1024).unwrap_err().to_string();
    assert!(err.contains("this device has no"), "{err}");
    for (bytes, why) in [(0, ": empty"), (6, ": not whole 4-byte words")] {
        let err = gpu.copy_host_to_tensor_on(same_family, &host, &small, bytes).unwrap_err().to_string();
        assert!(err.ends_with(why), "{bytes} bytes: {err}");
    }
    for bytes in [0, 10] {
        let err = gpu.host_buffer(bytes).err().expect("refused").to_string();
        assert!(err.contains("whole 4-byte words"), "{bytes} bytes: {err}");
    }
    // A copy into the host buffer, then its bytes: the read waits for the copy (no synchronize).
    zerostream::device::Backend::write(&gpu, &small, &[1.5; 256]);
    gpu.synchronize();
    gpu.copy_tensor_to_host_on(same_family, &small, &mut host, 1024).unwrap();
    let got: &[f32] = bytemuck::cast_slice(&host.bytes(&gpu).unwrap()[..1024]);
    assert!(got.iter().all(|&x| x == 1.5), "{:?}", &got[..4]);
}

/// The cpu device widens 16-bit uploads in place on rayon's threads with `half`'s slice conversions;
/// every word (NaNs, infinities, subnormals included) must widen as the trait's default does, at
/// sizes around its chunks, into a longer tensor whose tail stays as it was.
#[test]
fn cpu_16bit_uploads_widen_every_word_as_the_twin_does() {
    use zerostream::Backend;
    use zerostream::device::{CpuDevice, HalfFormat};
    let dev = CpuDevice::new(None);
    let every_word: Vec<u16> = (0..=u16::MAX).collect();
    for format in [HalfFormat::Bf16, HalfFormat::F16] {
        for len in [1usize, 65_535, 65_536, 65_537, 3 * 65_536 + 11] {
            let bits: Vec<u16> = (0..len).map(|i| every_word[(i * 7919) % every_word.len()]).collect();
            let t = dev.alloc(len + 5, "widened").unwrap();
            dev.fill(&t, -3.0);
            dev.write_16bit(&t, &bits, format).unwrap();
            let got = dev.read(&t);
            for (i, &b) in bits.iter().enumerate() {
                let want = format.to_f32(b);
                assert!(
                    got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                    "{format:?} word {b:#06x}: {} against {want}",
                    got[i]
                );
            }
            assert!(got[len..].iter().all(|&x| x == -3.0), "{format:?} {len}: the tail was written");
        }
    }
}

/// The gpu device uploads 16-bit values as they lie in memory (no packed copy on the host) and lends
/// f32 read-backs straight out of the mapping: every word, at odd lengths and past the parallel
/// upload's 1 MiB threshold, into f32 tensors (widened on the device) and 16-bit ones, must read back
/// as the twin widens it; a lent read equals `finish_read`'s vectors, 16-bit tensors among them. Through
/// both kinds of read-back buffer where the adapter has them.
#[test]
fn gpu_16bit_uploads_and_lent_reads_match_the_twin() {
    use zerostream::Backend;
    use zerostream::device::HalfFormat;
    let Some(gpu) = common::gpu_or_skip("gpu_16bit_uploads_and_lent_reads_match_the_twin") else { return };
    let every_word: Vec<u16> = (0..=u16::MAX).collect();
    for (read_back, format) in read_backs(&gpu).into_iter().flat_map(|r| [(r, HalfFormat::Bf16), (r, HalfFormat::F16)]) {
        gpu.set_read_back(read_back).unwrap();
        let pinned_before = gpu.pinned_read_bytes();
        for len in [1usize, 2, 7, 65_537, (1 << 19) + 3] {
            let bits: Vec<u16> = (0..len).map(|i| every_word[(i * 7919) % every_word.len()]).collect();
            let wide = gpu.alloc(len, "widened").unwrap();
            gpu.write_16bit(&wide, &bits, format).unwrap();
            let packed = gpu.alloc_16bit(len, "packed", format).unwrap();
            gpu.write_16bit(&packed, &bits, format).unwrap();
            let want: Vec<f32> = bits.iter().map(|&b| format.to_f32(b)).collect();
            let same = |got: &[f32]| {
                got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
            };
            let returned = gpu.read_many(&[&wide, &packed]);
            assert!(same(&returned[0]), "{format:?} len {len}: widened on the device");
            assert!(same(&returned[1]), "{format:?} len {len}: stored 16-bit");
            let pending = gpu.begin_read(&[&wide, &packed]);
            gpu.finish_read_with(pending, |lent| {
                assert_eq!(lent.len(), 2);
                assert!(same(lent[0]) && same(lent[1]), "{format:?} len {len}: a lent read differs");
            });
        }
        let pinned = gpu.pinned_read_bytes() > pinned_before;
        assert_eq!(pinned, read_back == ReadBack::Pinned, "{read_back:?}: read through pinned memory: {pinned}");
    }
    gpu.set_read_back(ReadBack::Mapped).unwrap();
}

/// The read-back kinds `gpu` can use: mapped buffers, and pinned host memory where it makes it (said
/// where it cannot: those runs read through mapped buffers only).
fn read_backs(gpu: &zerostream::device::GpuDevice) -> Vec<ReadBack> {
    match gpu.pinned_read_back_unavailable() {
        None => vec![ReadBack::Mapped, ReadBack::Pinned],
        Some(why) => {
            eprintln!("pinned read-backs not tested: no host-memory buffers here ({why})");
            vec![ReadBack::Mapped]
        }
    }
}

/// Finishing a read submits the work recorded after the read began before the host blocks, so the
/// device runs it while the host waits and adds (the trainer records block l's backward before it
/// finishes block l + 1's gradient download); the values are those of the work before the read.
#[test]
fn finishing_a_read_submits_the_work_recorded_after_it() {
    use zerostream::Backend;
    let Some(gpu) = common::gpu_or_skip("finishing_a_read_submits_the_work_recorded_after_it") else { return };
    for read_back in read_backs(&gpu) {
        gpu.set_read_back(read_back).unwrap();
        let (a, b) = (gpu.alloc(1000, "a").unwrap(), gpu.alloc(1000, "b").unwrap());
        gpu.fill(&a, 1.5);
        let pending = gpu.begin_read(&[&a]);
        gpu.fill(&b, 2.5);
        gpu.fill(&a, 3.5);
        assert_eq!(gpu.unsubmitted_passes(), 2, "{read_back:?}: the fills after the read are only recorded");
        let got = gpu.finish_read(pending);
        assert!(got[0].iter().all(|&v| v == 1.5), "{read_back:?}: the read saw work recorded after it");
        assert_eq!(gpu.unsubmitted_passes(), 0, "{read_back:?}: the host waited with work left unsubmitted");
        assert!(gpu.read(&b).iter().all(|&v| v == 2.5) && gpu.read(&a).iter().all(|&v| v == 3.5));
    }
    gpu.set_read_back(ReadBack::Mapped).unwrap();
}

/// Uploads from pinned host memory (`GpuDevice::alloc_pinned`) are one device copy from where the bytes
/// lie: every byte arrives, at offsets inside the buffer and with an odd last 16-bit value written on
/// its own, small uploads through `write_buffer` as before; and a host write right after an upload
/// waits for the copy, so the device gets the bytes as they were when written (64 MiB: a copy long
/// enough that a write not waiting for it would overtake it, as it did when the wait was removed).
#[test]
fn pinned_uploads_copy_in_place_and_host_writes_wait_for_them() {
    let Some(gpu) = common::gpu_or_skip("pinned_uploads_copy_in_place_and_host_writes_wait_for_them") else { return };
    if let Some(why) = gpu.host_staging_unavailable() {
        assert!(gpu.alloc_pinned(4096).is_err());
        eprintln!("SKIPPED pinned_uploads_copy_in_place_and_host_writes_wait_for_them: no host-memory buffers here ({why})");
        return;
    }
    use zerostream::device::{Backend, HalfFormat};
    let n = 16 << 20;
    let mut pinned = gpu.alloc_pinned(4 * n + 12).unwrap();
    assert!(pinned.is_in_host_memory() && pinned.bytes().iter().all(|&b| b == 0));
    let values: Vec<f32> = (0..n + 3).map(|i| i as f32 * 0.5 - 7.0).collect();
    pinned.as_mut_slice::<f32>().copy_from_slice(&values);
    let whole = gpu.alloc(n, "whole").unwrap();
    let before = gpu.pinned_upload_bytes();
    gpu.write(&whole, &pinned.as_slice::<f32>()[3..]);
    assert_eq!(gpu.pinned_upload_bytes() - before, 4 * n as u64, "the upload copied from pinned memory");
    // The host overwrites the buffer at once: this waits for the copy above.
    pinned.as_mut_slice::<f32>().fill(-1.0);
    assert!(gpu.read(&whole) == values[3..], "the copy saw the host's later write");
    // 16-bit words: the pairs copied in place, the odd last one written on its own.
    let h = (1 << 20) + 1;
    let halves: Vec<u16> = (0..h).map(|i| 0x3c00 + (i % 1000) as u16).collect();
    pinned.as_mut_slice::<u16>()[..h].copy_from_slice(&halves);
    let t = gpu.alloc_16bit(h, "halves", HalfFormat::F16).unwrap();
    let before = gpu.pinned_upload_bytes();
    gpu.write_16bit(&t, &pinned.as_slice::<u16>()[..h], HalfFormat::F16).unwrap();
    assert_eq!(gpu.pinned_upload_bytes() - before, (h as u64 - 1) * 2, "the pairs copied from pinned memory");
    let want: Vec<f32> = halves.iter().map(|&h| HalfFormat::F16.to_f32(h)).collect();
    assert!(gpu.read(&t) == want);
    // A small upload from pinned memory goes through write_buffer, as from anywhere.
    let small = gpu.alloc(1000, "small").unwrap();
    let before = gpu.pinned_upload_bytes();
    gpu.write(&small, &pinned.as_slice::<f32>()[..1000]);
    assert_eq!(gpu.pinned_upload_bytes(), before);
    assert!(gpu.read(&small) == pinned.as_slice::<f32>()[..1000]);
    // Dropped while nothing copies from it; a later upload from ordinary memory is staged as before.
    drop(pinned);
    let after = gpu.pinned_upload_bytes();
    gpu.write(&whole, &values[..n]);
    assert_eq!(gpu.pinned_upload_bytes(), after);
    assert!(gpu.read(&whole) == values[..n]);
}
