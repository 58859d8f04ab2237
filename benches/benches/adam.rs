//! CPU AdamW throughput over a 16M-parameter shard: bf16 gradients in, bf16 parameter copy out (28 bytes
//! per parameter), and the fp32-only mode. Criterion's elements/s are parameters/s.
//! For the fraction of memory bandwidth, run `zerostream bench adam`, which measures the triad alongside.
//!
//! Run: `cargo bench -p zerostream-benches --bench adam`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use zerostream_offload::adam::{AdamConfig, AdamW, DEFAULT_CHUNK_ELEMS, Grads, ParamCopy};

fn adam(c: &mut Criterion) {
    let n = 16 << 20;
    let adam = AdamW::new(AdamConfig::default(), 0, DEFAULT_CHUNK_ELEMS);
    let (mut p, mut m, mut v) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let g32 = vec![1e-3f32; n];
    let g16 = vec![bf16::from_f32(1e-3); n];
    let mut copy = vec![bf16::ZERO; n];
    let mut group = c.benchmark_group(format!("adam/{} threads {}", adam.threads(), adam.isa().name()));
    group.sample_size(10).throughput(Throughput::Elements(n as u64));
    let mut step = 0u64;
    group.bench_function("bf16 grads, bf16 copy (16M params)", |b| {
        b.iter(|| {
            step += 1;
            adam.step(&mut p, &mut m, &mut v, Grads::Bf16(&g16), ParamCopy::Bf16(&mut copy), step, 1.0, true)
        })
    });
    group.bench_function("f32 grads, no copy (16M params)", |b| {
        b.iter(|| {
            step += 1;
            adam.step(&mut p, &mut m, &mut v, Grads::F32(&g32), ParamCopy::None, step, 1.0, true)
        })
    });
    group.finish();
}

criterion_group!(benches, adam);
criterion_main!(benches);
