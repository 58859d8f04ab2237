//! GFLOP/s of the matmul kernel at GPT-2 124M shapes (B*T = 1024, C = 768), on the cpu device and on
//! every GPU adapter found. Criterion reports throughput in elements/s where one element is one FLOP,
//! so "Gelem/s" reads as GFLOP/s. The GPU is synchronised before the clock stops.
//!
//! Run: `cargo bench -p zerostream-benches --bench matmul`. Record results in benches/results/.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::time::Duration;
use zerostream::device::{Backend, CpuDevice, GpuDevice, MatmulShape, Operand};

/// (name, shape) of the products in one GPT-2 124M block, forward and backward.
fn shapes() -> Vec<(&'static str, MatmulShape)> {
    let (bt, c) = (1024, 768);
    vec![
        ("qkv fwd 1024x2304x768", MatmulShape::row_major(bt, 3 * c, c)),
        ("fc fwd 1024x3072x768", MatmulShape::row_major(bt, 4 * c, c)),
        ("fc_proj fwd 1024x768x3072", MatmulShape::row_major(bt, c, 4 * c)),
        (
            "fc dW 768x3072x1024 (A^T)",
            MatmulShape { m: c, n: 4 * c, k: bt, a: Operand::transposed(c), b: Operand::row_major(4 * c), c: Operand::row_major(4 * c) },
        ),
        (
            "fc dX 1024x768x3072 (B^T)",
            MatmulShape { m: bt, n: c, k: 4 * c, a: Operand::row_major(4 * c), b: Operand::transposed(4 * c), c: Operand::row_major(c) },
        ),
    ]
}

fn operand_len(op: &Operand, rows: usize, cols: usize) -> usize {
    op.span(0..rows, 0..cols).end
}

fn bench_device<D: Backend>(c: &mut Criterion, dev: &D, label: &str, sync: &dyn Fn()) {
    let mut group = c.benchmark_group(format!("matmul/{label}"));
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    for (name, s) in shapes() {
        let a = dev.alloc(operand_len(&s.a, s.m, s.k), "a").unwrap();
        let b = dev.alloc(operand_len(&s.b, s.k, s.n), "b").unwrap();
        let out = dev.alloc(s.m * s.n, "c").unwrap();
        dev.fill(&a, 0.5);
        dev.fill(&b, 0.25);
        group.throughput(Throughput::Elements(s.flops() as u64));
        group.bench_function(name, |bench| {
            bench.iter(|| {
                dev.matmul(&out, &a, &b, None, &s, false);
                sync();
            })
        });
    }
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let cpu = CpuDevice::new(None);
    bench_device(c, &cpu, "cpu", &|| {});
    for summary in zerostream::device::gpu::list_adapters() {
        let gpu = GpuDevice::open(Some(&summary.index.to_string()), None).expect("open adapter");
        let label = format!("gpu {}", summary.name.split_whitespace().next().unwrap_or("adapter"));
        bench_device(c, &gpu, &label, &|| gpu.synchronize());
    }
}

criterion_group!(benches, matmul);
criterion_main!(benches);
