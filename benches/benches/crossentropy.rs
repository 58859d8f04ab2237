//! The cpu device's cross-entropy in vocabulary chunks: the fast kernels (`ops::crossentropy_fast`, what
//! the cpu device runs) beside their plain-Rust twins (`ops::crossentropy`), at GPT-2 124M's head: BT =
//! 1024 rows, the first chunk of 8192 columns of the (BT, V = 50257) logits (row stride V). Throughput
//! is the bytes the op must move (each input read once, each output written once), so criterion's
//! "GiB/s" compares with the machine's memory bandwidth.
//!
//! Run: `cargo bench -p zerostream-benches --bench crossentropy`. Record results in benches/results/.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use zerostream::ops::crossentropy::{self as twin, VocabChunk};
use zerostream::ops::crossentropy_fast as fast;

const ROWS: usize = 1024;
const VOCAB: usize = 50257;
const CHUNK_COLS: usize = 8192;

/// Values in [-4, 4) from a fixed integer hash: no random crate, the same inputs every run.
fn logits() -> Vec<f32> {
    (0..ROWS * VOCAB).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0).collect()
}

fn bench(c: &mut Criterion) {
    let n_chunks = VOCAB.div_ceil(CHUNK_COLS);
    let chunk = VocabChunk { rows: ROWS, start: 0, cols: CHUNK_COLS, index: 0, n_chunks, offset: 0, row_stride: VOCAB };
    // Every 7th row's target in the chunk, the others past it.
    let targets: Vec<u32> = (0..ROWS as u32).map(|r| if r % 7 == 0 { r % CHUNK_COLS as u32 } else { 9000 + r }).collect();
    let mut logits = logits();
    let mut stats = vec![0.0f32; ROWS * n_chunks * 3];
    // An lse near the logits' own keeps exp(x - lse) in range repetition after repetition.
    let lse = vec![12.0f32; ROWS];
    let elems = (ROWS * CHUNK_COLS) as u64;

    let mut group = c.benchmark_group("crossentropy_chunk 1024x8192 of V=50257");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Bytes(4 * (elems + 4 * ROWS as u64)));
    group.bench_function("stats twin", |b| b.iter(|| twin::crossentropy_chunk_stats(&mut stats, &logits, &targets, &chunk)));
    group.bench_function("stats fast", |b| b.iter(|| fast::crossentropy_chunk_stats(&mut stats, &logits, &targets, &chunk)));
    group.throughput(Throughput::Bytes(4 * (2 * elems + 2 * ROWS as u64)));
    group.bench_function("grad twin", |b| b.iter(|| twin::crossentropy_chunk_grad(&mut logits, &lse, &targets, &chunk, 1.0 / ROWS as f32)));
    group.bench_function("grad fast", |b| b.iter(|| fast::crossentropy_chunk_grad(&mut logits, &lse, &targets, &chunk, 1.0 / ROWS as f32)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
