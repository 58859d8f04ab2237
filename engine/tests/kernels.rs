//! Every GPU kernel against its plain-Rust twin (the cpu device), on seeded random inputs at awkward
//! sizes (1, 63, 65, 4097, and shapes that are multiples of no tile), with `atol + rtol * |ref|`:
//! the matmul (fp32 and with a 16-bit B), the element-wise kernels, activations, layer norm, the
//! embedding and the cross-entropy (whole and in vocabulary chunks), and the half casts. Attention is
//! in `kernels_attention.rs`, Llama's own kernels in `kernels_llama.rs`.
//! Each case also runs with one binding limited to 64 KiB, so the paths that split large tensors
//! into windows are exercised at sizes a test can afford.

#[macro_use]
mod common;

use common::kernel_check::{Outputs, tensor};
use common::{gpu_or_skip, random, random_tokens};
use zerostream::device::{Activation, Backend, HalfFormat, MatmulShape, Operand};
use zerostream::ops::crossentropy::{VocabChunk, crossentropy_combine};

/// B stored in 16 bits (the weights of a bf16/fp16 working copy), forward and transposed, at offset 0
/// (the kernel's vector loads where N or K allow) and at an odd offset (packed words split, scalar loads);
/// the cpu device holds the same values widened.
fn matmul_16bit_b_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    let shapes = [(1, 1, 1), (3, 17, 65), (63, 65, 17), (7, 33, 4097), (129, 65, 130), (130, 200, 96)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        for (format, b_offset) in [(HalfFormat::F16, 0), (HalfFormat::F16, 1), (HalfFormat::Bf16, 0), (HalfFormat::Bf16, 1)] {
            let seed = 100 + 10 * i as u64;
            let a = random(seed, m * k, 1.0);
            let b = random(seed + 1, k * n + b_offset, 1.0);
            let bits: Vec<u16> = match format {
                HalfFormat::F16 => b.iter().map(|x| half::f16::from_f32(*x).to_bits()).collect(),
                HalfFormat::Bf16 => b.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect(),
            };
            let ta = tensor(dev, &a);
            let tb = dev.alloc_16bit(bits.len(), "b16", format).unwrap();
            dev.write_16bit(&tb, &bits, format).unwrap();
            let c = dev.alloc(m * n, "c").unwrap();
            let forward = MatmulShape {
                m,
                n,
                k,
                a: Operand::row_major(k),
                b: Operand { offset: b_offset, row_stride: n, col_stride: 1 },
                c: Operand::row_major(n),
            };
            dev.matmul(&c, &ta, &tb, None, &forward, false);
            out.push((format!("{m}x{n}x{k} {format:?} B at offset {b_offset}"), dev.read(&c)));
            let c = dev.alloc(m * n, "c").unwrap();
            let transposed = MatmulShape { b: Operand { offset: b_offset, row_stride: 1, col_stride: k }, ..forward };
            dev.matmul(&c, &ta, &tb, None, &transposed, false);
            out.push((format!("{m}x{n}x{k} {format:?} B^T at offset {b_offset}"), dev.read(&c)));
            out.push((format!("{format:?} B read back"), dev.read(&tb)));
        }
    }
    out
}

/// (m, n, k) of the f32 product tests: single elements, K = 1, every kind of edge of the kernel's
/// 128 x 128 x 8 tiles (1, 3, 17, 65, 129, 130 are multiples of neither 4 nor 8), multiples of 4 (the
/// vector loads), and a K that needs splitting under 64 KiB bindings.
const MATMUL_SHAPES: [(usize, usize, usize); 10] = [
    (1, 1, 1),
    (3, 17, 1),
    (63, 65, 17),
    (65, 63, 130),
    (17, 129, 65),
    (129, 130, 3),
    (130, 200, 96),
    (7, 33, 4097),
    (256, 132, 40),
    (1, 130, 129),
];

fn matmul_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (i, &(m, n, k)) in MATMUL_SHAPES.iter().enumerate() {
        let seed = 10 * i as u64;
        let a = random(seed, m * k, 1.0);
        let b = random(seed + 1, k * n, 1.0);
        let bias = random(seed + 2, n, 1.0);
        let c0 = random(seed + 3, m * n, 1.0);
        let (ta, tb, tbias) = (tensor(dev, &a), tensor(dev, &b), tensor(dev, &bias));
        // Forward: row-major with bias, overwriting.
        let c = tensor(dev, &c0);
        dev.matmul(&c, &ta, &tb, Some(&tbias), &MatmulShape::row_major(m, n, k), false);
        out.push((format!("{m}x{n}x{k} forward"), dev.read(&c)));
        // A transposed (as in dW = X^T dY) and accumulating into C.
        let c = tensor(dev, &c0);
        let shape = MatmulShape { m, n, k, a: Operand::transposed(m), b: Operand::row_major(n), c: Operand::row_major(n) };
        dev.matmul(&c, &ta, &tb, None, &shape, true);
        out.push((format!("{m}x{n}x{k} A^T accumulate"), dev.read(&c)));
        // B transposed (as in dX = dY W^T), with an offset into C's rows.
        let c = tensor(dev, &vec![0.0; m * (n + 3)]);
        let shape = MatmulShape {
            m,
            n,
            k,
            a: Operand::row_major(k),
            b: Operand::transposed(k),
            c: Operand { offset: 3, row_stride: n + 3, col_stride: 1 },
        };
        dev.matmul(&c, &ta, &tb, None, &shape, false);
        out.push((format!("{m}x{n}x{k} B^T strided C"), dev.read(&c)));
        // Both transposed, with a bias, accumulating.
        let c = tensor(dev, &c0);
        let shape = MatmulShape { m, n, k, a: Operand::transposed(m), b: Operand::transposed(k), c: Operand::row_major(n) };
        dev.matmul(&c, &ta, &tb, Some(&tbias), &shape, true);
        out.push((format!("{m}x{n}x{k} A^T B^T bias accumulate"), dev.read(&c)));
        // bias_backward
        let db = tensor(dev, &bias);
        dev.bias_backward(&db, &tensor(dev, &c0), m, n);
        out.push((format!("{m}x{n} bias_backward"), dev.read(&db)));
    }
    out
}

#[test]
fn matmul_matches_twin() {
    // K up to 4097 of f32 products: rounding grows with sqrt(K).
    check!("matmul", matmul_case, 1e-4, 1e-4);
}

/// The products of `matmul_case`'s shapes, forward with bias and accumulating, and with a bf16 B^T.
fn matmul_split_products(dev: &zerostream::device::GpuDevice) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    for (i, &(m, n, k)) in MATMUL_SHAPES.iter().enumerate() {
        let seed = 500 + 10 * i as u64;
        let (a, b) = (tensor(dev, &random(seed, m * k, 1.0)), random(seed + 1, k * n, 1.0));
        let (tb, bias) = (tensor(dev, &b), tensor(dev, &random(seed + 2, n, 1.0)));
        let c = tensor(dev, &random(seed + 3, m * n, 1.0));
        dev.matmul(&c, &a, &tb, Some(&bias), &MatmulShape::row_major(m, n, k), true);
        out.push((format!("{m}x{n}x{k} forward, bias, accumulate"), dev.read(&c)));
        let bits: Vec<u16> = b.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
        let tb16 = dev.alloc_16bit(bits.len(), "b16", HalfFormat::Bf16).unwrap();
        dev.write_16bit(&tb16, &bits, HalfFormat::Bf16).unwrap();
        let c = dev.alloc(m * n, "c").unwrap();
        let shape = MatmulShape { b: Operand::transposed(k), ..MatmulShape::row_major(m, n, k) };
        dev.matmul(&c, &a, &tb16, None, &shape, false);
        out.push((format!("{m}x{n}x{k} bf16 B^T"), dev.read(&c)));
    }
    out
}

/// A product's bits do not depend on how the engine splits it: with 64 KiB bindings the same products
/// run as several dispatches (K halved into accumulating pieces, rows and columns into windows at other
/// offsets, so other tiles take the vector or the scalar loads), and every bit must stay the same.
#[test]
fn matmul_bits_do_not_depend_on_the_split() {
    let Some(gpu) = gpu_or_skip("matmul split") else { return };
    let mut small = gpu_or_skip("matmul split").unwrap();
    small.limit_binding_bytes_for_tests(64 << 10);
    let (whole, split) = (matmul_split_products(&gpu), matmul_split_products(&small));
    for ((name, w), (_, s)) in whole.iter().zip(&split) {
        let differ = w.iter().zip(s).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "matmul {name}: {differ} of {} elements differ between whole and split dispatches", w.len());
    }
}

fn elementwise_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for n in [1, 63, 65, 4097, 40_000] {
        let x = random(n as u64, n, 3.0);
        let y = random(n as u64 + 1, n, 3.0);
        let (tx, ty) = (tensor(dev, &x), tensor(dev, &y));
        let t = dev.alloc(n, "out").unwrap();
        dev.residual_forward(&t, &tx, &ty);
        out.push((format!("residual_forward {n}"), dev.read(&t)));
        dev.axpy(&t, 0.5, &tx, -2.0);
        out.push((format!("axpy {n}"), dev.read(&t)));
        dev.fill(&t, 1.25);
        out.push((format!("fill {n}"), dev.read(&t)));
        out.push((format!("sum_squares {n}"), vec![dev.sum_squares(&tx) as f32]));
    }
    out
}

#[test]
fn elementwise_ops_match_twins() {
    check!("elementwise", elementwise_case, 1e-5, 1e-5);
}

/// Each MLP activation, forward and backward (accumulating into a non-zero dx), at awkward sizes, and at
/// magnitudes where tanh and erfc saturate and exp underflows (no NaN), and at 0 (ReLU's kink).
fn activation_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for f in [Activation::GeluTanh, Activation::GeluErf, Activation::Relu] {
        for n in [1, 63, 65, 4097, 40_000] {
            let (x, y) = (random(n as u64, n, 4.0), random(n as u64 + 1, n, 3.0));
            let (tx, ty) = (tensor(dev, &x), tensor(dev, &y));
            let t = dev.alloc(n, "out").unwrap();
            dev.activation_forward(f, &t, &tx);
            out.push((format!("{f:?} forward {n}"), dev.read(&t)));
            let g = tensor(dev, &y);
            dev.activation_backward(f, &g, &tx, &ty);
            out.push((format!("{f:?} backward {n}"), dev.read(&g)));
        }
        let edges = [-1e4, -30.0, -9.0, -0.0, 0.0, 1e-30, 9.0, 30.0, 1e4];
        let (big, ones) = (tensor(dev, &edges), tensor(dev, &[1.0; 9]));
        let t = dev.alloc(edges.len(), "out").unwrap();
        dev.activation_forward(f, &t, &big);
        let (forward, dx) = (dev.read(&t), tensor(dev, &[0.0; 9]));
        assert!(forward.iter().all(|v| v.is_finite()), "{f:?} forward at the edges: {forward:?}");
        out.push((format!("{f:?} forward at the edges"), forward));
        dev.activation_backward(f, &dx, &big, &ones);
        out.push((format!("{f:?} backward at the edges"), dev.read(&dx)));
    }
    out
}

#[test]
fn activations_match_twins() {
    check!("activations", activation_case, 1e-5, 1e-5);
}

fn layernorm_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (rows, c) in [(1, 1), (3, 63), (65, 65), (2, 4097), (100, 300)] {
        let seed = (rows * 1000 + c) as u64;
        let x: Vec<f32> = random(seed, rows * c, 2.0).iter().map(|v| v + 0.5).collect();
        let (w, b) = (random(seed + 1, c, 1.0), random(seed + 2, c, 1.0));
        let (tx, tw, tb) = (tensor(dev, &x), tensor(dev, &w), tensor(dev, &b));
        let (o, mean, rstd) = (dev.alloc(rows * c, "o").unwrap(), dev.alloc(rows, "m").unwrap(), dev.alloc(rows, "r").unwrap());
        dev.layernorm_forward(&o, &mean, &rstd, &tx, &tw, &tb, rows, c, 1e-5);
        out.push((format!("forward {rows}x{c}"), dev.read(&o)));
        out.push((format!("rstd {rows}x{c}"), dev.read(&rstd)));
        let dout = tensor(dev, &random(seed + 3, rows * c, 1.0));
        let (dx, dw, db) = (tensor(dev, &random(seed + 4, rows * c, 1.0)), tensor(dev, &w), tensor(dev, &b));
        dev.layernorm_backward(&dx, &dw, &db, &dout, &tx, &tw, &mean, &rstd, rows, c);
        out.push((format!("dx {rows}x{c}"), dev.read(&dx)));
        out.push((format!("dweight {rows}x{c}"), dev.read(&dw)));
        out.push((format!("dbias {rows}x{c}"), dev.read(&db)));
    }
    out
}

#[test]
fn layernorm_matches_twin() {
    check!("layernorm", layernorm_case, 1e-4, 1e-4);
}

/// The column sums over rows (bias_backward, layernorm's dweight and dbias) on tall inputs: many blocks
/// of 64 rows, a last block of one row, exactly one and just over one block, a short and a wide output.
fn column_sums_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (rows, n) in [(1000, 77), (4097, 3), (130, 1000), (64, 65), (65, 64), (2049, 2)] {
        let seed = (rows * 7919 + n) as u64;
        let dout = random(seed, rows * n, 1.0);
        let db = tensor(dev, &random(seed + 1, n, 1.0));
        dev.bias_backward(&db, &tensor(dev, &dout), rows, n);
        out.push((format!("bias_backward {rows}x{n}"), dev.read(&db)));
        let x: Vec<f32> = random(seed + 2, rows * n, 2.0).iter().map(|v| v + 0.5).collect();
        let (w, b) = (random(seed + 3, n, 1.0), random(seed + 4, n, 1.0));
        let (tx, tw, tb) = (tensor(dev, &x), tensor(dev, &w), tensor(dev, &b));
        let (o, mean, rstd) = (dev.alloc(rows * n, "o").unwrap(), dev.alloc(rows, "m").unwrap(), dev.alloc(rows, "r").unwrap());
        dev.layernorm_forward(&o, &mean, &rstd, &tx, &tw, &tb, rows, n, 1e-5);
        let (dx, dw, dbias) = (dev.alloc(rows * n, "dx").unwrap(), tensor(dev, &w), tensor(dev, &b));
        dev.layernorm_backward(&dx, &dw, &dbias, &tensor(dev, &dout), &tx, &tw, &mean, &rstd, rows, n);
        out.push((format!("layernorm dweight {rows}x{n}"), dev.read(&dw)));
        out.push((format!("layernorm dbias {rows}x{n}"), dev.read(&dbias)));
    }
    out
}

#[test]
fn column_sums_match_twins() {
    // Sums of up to 4097 terms of magnitude ~1-3.
    check!("column sums", column_sums_case, 2e-4, 1e-4);
}

fn embedding_and_loss_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    // vocab 4097 x C 5 = 80 KiB of wte: split into vocabulary windows under 64 KiB bindings.
    for (batch, seq_len, c, vocab) in [(1, 1, 1, 1), (2, 33, 5, 4097), (3, 7, 65, 63)] {
        let tag = format!("B{batch} T{seq_len} C{c} V{vocab}");
        let seed = (batch + seq_len * 10 + c * 100 + vocab) as u64;
        let ids = random_tokens(seed, batch * seq_len, vocab);
        let toks = dev.tokens(&ids).unwrap();
        let (wte, wpe) = (tensor(dev, &random(seed + 1, vocab * c, 1.0)), tensor(dev, &random(seed + 2, seq_len * c, 1.0)));
        let o = dev.alloc(batch * seq_len * c, "o").unwrap();
        dev.encoder_forward(&o, &toks, &wte, &wpe, seq_len, c);
        out.push((format!("encoder_forward {tag}"), dev.read(&o)));
        let dout = tensor(dev, &random(seed + 3, batch * seq_len * c, 1.0));
        dev.encoder_backward(&wte, &wpe, &dout, &toks, batch, seq_len, c);
        out.push((format!("encoder_backward dwte {tag}"), dev.read(&wte)));
        out.push((format!("encoder_backward dwpe {tag}"), dev.read(&wpe)));

        let rows = batch * seq_len;
        let logits_data = random(seed + 4, rows * vocab, 8.0);
        let logits = tensor(dev, &logits_data);
        let losses = dev.alloc(rows, "losses").unwrap();
        dev.crossentropy(&losses, &logits, &toks, vocab, None);
        out.push((format!("crossentropy loss {tag}"), dev.read(&losses)));
        out.push((format!("crossentropy untouched logits {tag}"), dev.read(&logits)));
        dev.crossentropy(&losses, &logits, &toks, vocab, Some(1.0 / rows as f32));
        out.push((format!("crossentropy dlogits {tag}"), dev.read(&logits)));
    }
    out
}

#[test]
fn embedding_and_crossentropy_match_twins() {
    check!("embedding and crossentropy", embedding_and_loss_case, 1e-5, 1e-5);
}

/// (V, chunk columns) of the chunked cross-entropy: one column; chunks that do not divide V (the last
/// one shorter); GPT-2's vocabulary in chunks of 8192 (one row of the matrix past a 64 KiB binding) and
/// of 20000 (one row of a chunk past it: column pieces).
const VOCAB_CHUNKS: [(usize, usize); 5] = [(1, 1), (17, 5), (1001, 300), (50257, 8192), (50257, 20000)];

/// The chunks' columns of every row, gathered into a chunk-sized scratch (row stride = columns).
fn chunk_columns(matrix: &[f32], chunk: &VocabChunk) -> Vec<f32> {
    (0..chunk.rows).flat_map(|r| matrix[chunk.at(r, 0)..chunk.at(r, chunk.cols)].iter().copied()).collect()
}

/// Every chunk's statistics, then (with the lse combined from them on the host) every chunk's gradient,
/// in both layouts: a window of the whole (rows, V) matrix (offset = start, row stride V) and a
/// chunk-sized scratch (offset 0, row stride = columns). Targets include the first and last columns.
fn crossentropy_chunk_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for rows in [1, 3, 37] {
        for (vocab, chunk_cols) in VOCAB_CHUNKS {
            let tag = format!("rows {rows} V {vocab} chunk {chunk_cols}");
            let seed = (rows * 100_003 + vocab * 7 + chunk_cols) as u64;
            let logits_data = random(seed, rows * vocab, 8.0);
            let mut ids = random_tokens(seed + 1, rows, vocab);
            ids[0] = vocab as u32 - 1; // in the last, shorter chunk
            if rows > 1 {
                ids[1] = 0;
            }
            let toks = dev.tokens(&ids).unwrap();
            let n_chunks = vocab.div_ceil(chunk_cols);
            let chunks: Vec<VocabChunk> = (0..n_chunks)
                .map(|index| {
                    let (start, cols) = (index * chunk_cols, chunk_cols.min(vocab - index * chunk_cols));
                    VocabChunk { rows, start, cols, index, n_chunks, offset: start, row_stride: vocab }
                })
                .collect();
            let logits = tensor(dev, &logits_data);
            let (whole_stats, scratch_stats) =
                (dev.alloc(rows * n_chunks * 3, "stats").unwrap(), dev.alloc(rows * n_chunks * 3, "stats").unwrap());
            for chunk in &chunks {
                dev.crossentropy_chunk_stats(&whole_stats, &logits, &toks, chunk);
                let scratch = tensor(dev, &chunk_columns(&logits_data, chunk));
                dev.crossentropy_chunk_stats(&scratch_stats, &scratch, &toks, &VocabChunk { offset: 0, row_stride: chunk.cols, ..*chunk });
            }
            let stats = dev.read(&whole_stats);
            let (lse, losses) = crossentropy_combine(&stats, rows, n_chunks);
            out.push((format!("chunk stats, whole matrix, {tag}"), stats));
            out.push((format!("chunk stats, scratch, {tag}"), dev.read(&scratch_stats)));
            out.push((format!("combined losses {tag}"), losses));

            let (lse_t, grad_scale) = (tensor(dev, &lse), 1.0 / rows as f32);
            let mut scratch_grads = vec![0.0; rows * vocab];
            for chunk in &chunks {
                dev.crossentropy_chunk_grad(&logits, &lse_t, &toks, chunk, grad_scale);
                let scratch = tensor(dev, &chunk_columns(&logits_data, chunk));
                dev.crossentropy_chunk_grad(
                    &scratch,
                    &lse_t,
                    &toks,
                    &VocabChunk { offset: 0, row_stride: chunk.cols, ..*chunk },
                    grad_scale,
                );
                for (r, grads) in dev.read(&scratch).chunks(chunk.cols).enumerate() {
                    scratch_grads[chunk.at(r, 0)..chunk.at(r, chunk.cols)].copy_from_slice(grads);
                }
            }
            out.push((format!("chunk dlogits, whole matrix, {tag}"), dev.read(&logits)));
            out.push((format!("chunk dlogits, scratch, {tag}"), scratch_grads));
        }
    }
    out
}

/// Maxima and target logits are exact on every device; the sums of exp are in other orders (the GPU's
/// lanes combine in a tree), hence the relative tolerance; the gradients inherit the lse's rounding.
#[test]
fn crossentropy_chunks_match_twins() {
    check!("crossentropy chunks", crossentropy_chunk_case, 1e-7, 2e-5);
}

#[test]
fn matmul_with_16bit_b_matches_twin() {
    check!("matmul with 16-bit B", matmul_16bit_b_case, 1e-4, 1e-4);
}

/// pack_f16.wgsl (the direct cooperative-matrix matmul's operands) against its twin, bit for bit: f32,
/// f16 and bf16 sources, row-major and transposed, at offsets, with padding on both sides, at awkward sizes.
#[test]
fn pack_f16_matches_twin() {
    use zerostream::ops::matmul_f16::{PackSource, PackedShape, pack_f16};
    let Some(gpu) = gpu_or_skip("pack_f16") else { return };
    for (i, &(rows, cols, rows_pad, cols_pad)) in [(1, 1, 16, 16), (5, 3, 8, 4), (33, 17, 64, 32), (130, 97, 256, 112)].iter().enumerate() {
        for (transposed, offset) in [(false, 0), (true, 3)] {
            let op = if transposed {
                Operand { offset, row_stride: 1, col_stride: rows }
            } else {
                Operand { offset, row_stride: cols, col_stride: 1 }
            };
            let shape = PackedShape { rows, cols, rows_pad, cols_pad };
            let mut x = random(40 + i as u64, offset + rows * cols, 100.0);
            x[offset] = 70000.0; // beyond f16: +inf
            let f16s: Vec<u16> = x.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect();
            let bf16s: Vec<u16> = x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
            let f32_source = tensor(&gpu, &x);
            let half_sources = [(HalfFormat::F16, &f16s, PackSource::F16(&f16s)), (HalfFormat::Bf16, &bf16s, PackSource::Bf16(&bf16s))];
            let mut cases = vec![("f32", f32_source, pack_f16(PackSource::F32(&x), &op, &shape))];
            for (format, bits, source) in half_sources {
                let t = gpu.alloc_16bit(bits.len(), "halves", format).unwrap();
                gpu.write_16bit(&t, bits, format).unwrap();
                cases.push((if format == HalfFormat::F16 { "f16" } else { "bf16" }, t, pack_f16(source, &op, &shape)));
            }
            for (name, source, want) in cases {
                // Garbage first, so the padding is seen to be written.
                let out = gpu.upload_words(&vec![0xdead_beef; rows_pad * cols_pad / 2], "packed").unwrap();
                gpu.pack_f16(&out, &source, &op, &shape);
                let got: Vec<u16> = gpu.read_words(&out).iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]).collect();
                assert_eq!(got, want, "pack_f16 {name} {rows}x{cols} into {rows_pad}x{cols_pad}, transposed {transposed}, offset {offset}");
            }
        }
    }
}

#[test]
fn half_casts_match_the_half_crate() {
    let Some(gpu) = gpu_or_skip("f16 casts") else { return };
    for n in [1usize, 63, 65, 4097] {
        let mut x = random(n as u64, n, 100.0);
        if n > 4 {
            x[0] = 70000.0; // beyond f16: +inf
            x[1] = 1e-8; // subnormal in f16
            x[2] = 1.0 + 1.0 / 2048.0; // a tie: rounds to even
        }
        if n > 64 {
            // The edges of common/f16_bits.wgsl (which matmul_coop.wgsl rounds its inputs with): the
            // largest f16 and the ties around it, infinities, the subnormal range and its ties, signs.
            let p = |e: i32| 2f32.powi(e);
            let edges = [65504.0, 65519.99, 65520.0, -65520.0, f32::INFINITY, f32::NEG_INFINITY, p(-25), 3.0 * p(-25), p(-14) - p(-26)];
            let more = [-1.5 * p(-24), 1e-30, -0.0, p(-25) * 1.000001, p(-14), -p(-15) * 1.0005, 2049.0, 2051.0, -1e-7];
            for (i, v) in edges.into_iter().chain(more).enumerate() {
                x[3 + i] = v;
            }
        }
        let tx = tensor(&gpu, &x);
        let words = gpu.upload_words(&vec![0u32; n.div_ceil(2)], "halves").unwrap();
        gpu.cast_f32_to_f16(&words, &tx, n);
        let got: Vec<u16> = gpu.read_words(&words).iter().flat_map(|w| [*w as u16, (*w >> 16) as u16]).take(n).collect();
        let mut want = vec![0u16; n];
        zerostream::ops::elementwise::cast_f32_to_f16(&mut want, &x);
        assert_eq!(got, want, "cast_f32_to_f16 n={n}");
        let back = gpu.alloc(n, "back").unwrap();
        gpu.cast_f16_to_f32(&back, &words, n);
        let mut want_back = vec![0f32; n];
        zerostream::ops::elementwise::cast_f16_to_f32(&mut want_back, &want);
        assert_eq!(gpu.read(&back), want_back, "cast_f16_to_f32 n={n}");
        // bf16 the same way, through the upload path the trainer uses.
        let halves: Vec<u16> = x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect();
        let wide = gpu.alloc(n, "bf16 widened").unwrap();
        gpu.write_16bit(&wide, &halves, HalfFormat::Bf16).unwrap();
        let mut want_wide = vec![0f32; n];
        zerostream::ops::elementwise::cast_bf16_to_f32(&mut want_wide, &halves);
        assert_eq!(gpu.read(&wide), want_wide, "cast_bf16_to_f32 n={n}");
        gpu.write_16bit(&wide, &want, HalfFormat::F16).unwrap();
        assert_eq!(gpu.read(&wide), want_back, "write_16bit f16 n={n}");
    }
}
