//! The `--grad-compression` / `--param-compression` codecs on one 4 Mi-element slice (16 MiB of f32,
//! a GPT-2 124M block's gradient is 7 Mi): the sender's encode with error feedback and the receiver's
//! decode-and-add, per mode. Throughput is elements, so criterion's "Melem/s" reads as the rate a
//! rank codes gradients at; run with RAYON_NUM_THREADS=1 for one core's rate.
//!
//! Run: `cargo bench -p zerostream-benches --bench codecs`. Record results in benches/results/.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use zerostream::comm::compress::{Codec, DEFAULT_CHUNK_ELEMS, GradCompression};

const ELEMS: usize = 4 << 20;

/// Gradient-like values of both signs and many magnitudes from a fixed integer hash.
fn gradient_like() -> Vec<f32> {
    (0..ELEMS)
        .map(|i| {
            let u = ((i as u32).wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 24) as f32 - 0.5;
            u * u * u * 1e-2
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let x = gradient_like();
    let mut group = c.benchmark_group("codec 4Mi elements");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(ELEMS as u64));
    for mode in [GradCompression::Bf16, GradCompression::Int8, GradCompression::OneBit, GradCompression::TopK(0.01)] {
        let codec = Codec::new(mode, DEFAULT_CHUNK_ELEMS).expect("a valid chunk");
        let mut bytes = vec![0u8; codec.encoded_bytes(ELEMS)];
        let mut residual = vec![0.0f32; ELEMS];
        group.bench_function(format!("{mode} encode with feedback"), |b| {
            b.iter(|| codec.encode_with_feedback(&x, &mut residual, &mut bytes))
        });
        let mut sum = x.clone();
        group.bench_function(format!("{mode} decode and add"), |b| b.iter(|| codec.decode_add(&bytes, &mut sum)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
