//! The per-row ops' checks: layer norm and RMSNorm forward and backward, SwiGLU, the GPT-2 encoder
//! (embedding gather and its scatter-add backward) and the cross-entropy, whole rows and both kernels of
//! the vocabulary-chunked loss.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, random, random_tokens, upload};
use crate::device::{Backend, VocabChunk};
use crate::ops::{crossentropy as ce, encoder, layernorm, rmsnorm, swiglu};

/// (rows, C) of the norms' inputs and their seed.
fn norm_shapes(all: &[(usize, usize)], keep: usize, salt: usize) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
    all[..keep].iter().map(move |&(rows, c)| (rows, c, (rows * salt + c) as u64))
}

/// Layer norm forward (out, mean, rstd), then its backward from the twin's mean and rstd into non-zero
/// dx, dweight and dbias (it accumulates). (rows, C): single elements, C about one and several lanes'
/// sweeps, a long row.
pub fn check_layernorm<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let tolerance = Tolerance::close(1e-4, 1e-4);
    let all = [(1, 1), (3, 63), (65, 65), (100, 300), (2, 4097)];
    let inputs = |rows: usize, c: usize, seed: u64| {
        let x: Vec<f32> = random(seed, rows * c, 2.0).iter().map(|v| v + 0.5).collect();
        let (w, b) = (random(seed + 1, c, 1.0), random(seed + 2, c, 1.0));
        let (mut out, mut mean, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
        layernorm::layernorm_forward(&mut out, &mut mean, &mut rstd, &x, &w, &b, rows, c, 1e-5);
        (x, w, b, [out, mean, rstd])
    };
    let mut fwd = Check::new("layernorm_forward", tolerance);
    for (rows, c, seed) in norm_shapes(&all, size.pick(5, 4), 1000) {
        let (x, w, b, want) = inputs(rows, c, seed);
        let (o, m, r) = (dev.alloc(rows * c, "selftest")?, dev.alloc(rows, "selftest")?, dev.alloc(rows, "selftest")?);
        dev.layernorm_forward(&o, &m, &r, &upload(dev, &x)?, &upload(dev, &w)?, &upload(dev, &b)?, rows, c, 1e-5);
        for ((name, t), want) in [("out", &o), ("mean", &m), ("rstd", &r)].into_iter().zip(&want) {
            fwd.compare(&format!("{name} {rows}x{c}"), &dev.read(t), want);
        }
    }
    let fwd = fwd.finish();
    let mut bwd = Check::new("layernorm_backward", tolerance);
    for (rows, c, seed) in norm_shapes(&all, size.pick(5, 4), 1000) {
        let (x, w, b, [_, mean, rstd]) = inputs(rows, c, seed);
        let dout = random(seed + 3, rows * c, 1.0);
        let (mut dx, mut dw, mut db) = (random(seed + 4, rows * c, 1.0), w.clone(), b);
        let (tdx, tdw, tdb) = (upload(dev, &dx)?, upload(dev, &dw)?, upload(dev, &db)?);
        let (tdout, tx, tw, tmean, trstd) =
            (upload(dev, &dout)?, upload(dev, &x)?, upload(dev, &w)?, upload(dev, &mean)?, upload(dev, &rstd)?);
        dev.layernorm_backward(&tdx, &tdw, &tdb, &tdout, &tx, &tw, &tmean, &trstd, rows, c);
        layernorm::layernorm_backward(&mut dx, &mut dw, &mut db, &dout, &x, &w, &mean, &rstd, rows, c);
        for (name, t, want) in [("dx", &tdx, &dx), ("dweight", &tdw, &dw), ("dbias", &tdb, &db)] {
            bwd.compare(&format!("{name} {rows}x{c}"), &dev.read(t), want);
        }
    }
    Ok(vec![fwd, bwd.finish()])
}

/// RMSNorm forward (out, rstd), then its backward from the twin's rstd into non-zero dx and dweight.
/// C below, just above and past one 256-lane sweep, many rows, a long row.
pub fn check_rmsnorm<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    // dweight sums 4097 rows through partials near 30 in magnitude (lavapipe splits fma in two).
    let tolerance = Tolerance::close(5e-5, 1e-5);
    let all = [(1, 1), (63, 48), (65, 65), (7, 257), (4097, 128), (2, 4097)];
    let inputs = |rows: usize, c: usize, seed: u64| {
        let (x, w) = (random(seed, rows * c, 2.0), random(seed + 1, c, 1.5));
        let (mut out, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows]);
        rmsnorm::rmsnorm_forward(&mut out, &mut rstd, &x, &w, rows, c, 1e-5);
        (x, w, out, rstd)
    };
    let mut fwd = Check::new("rmsnorm_forward", tolerance);
    for (rows, c, seed) in norm_shapes(&all, size.pick(6, 4), 10_000) {
        let (x, w, out, rstd) = inputs(rows, c, seed);
        let (o, r) = (dev.alloc(rows * c, "selftest")?, dev.alloc(rows, "selftest")?);
        dev.rmsnorm_forward(&o, &r, &upload(dev, &x)?, &upload(dev, &w)?, rows, c, 1e-5);
        fwd.compare(&format!("out {rows}x{c}"), &dev.read(&o), &out);
        fwd.compare(&format!("rstd {rows}x{c}"), &dev.read(&r), &rstd);
    }
    let fwd = fwd.finish();
    let mut bwd = Check::new("rmsnorm_backward", tolerance);
    for (rows, c, seed) in norm_shapes(&all, size.pick(6, 4), 10_000) {
        let (x, w, _, rstd) = inputs(rows, c, seed);
        let dout = random(seed + 2, rows * c, 1.0);
        let (mut dx, mut dw) = (random(seed + 3, rows * c, 1.0), w.clone());
        let (tdx, tdw, tdout, trstd) = (upload(dev, &dx)?, upload(dev, &dw)?, upload(dev, &dout)?, upload(dev, &rstd)?);
        dev.rmsnorm_backward(&tdx, &tdw, &tdout, &upload(dev, &x)?, &upload(dev, &w)?, &trstd, rows, c);
        rmsnorm::rmsnorm_backward(&mut dx, &mut dw, &dout, &x, &w, &rstd, rows, c);
        bwd.compare(&format!("dx {rows}x{c}"), &dev.read(&tdx), &dx);
        bwd.compare(&format!("dweight {rows}x{c}"), &dev.read(&tdw), &dw);
    }
    Ok(vec![fwd, bwd.finish()])
}

/// SwiGLU forward and backward (over garbage: it overwrites), at awkward sizes and with gates large
/// enough that the sigmoid saturates (no overflow, no NaN).
pub fn check_swiglu<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let tolerance = Tolerance::close(1e-5, 1e-5);
    let saturated = [-1e4, -200.0, -30.0, 30.0, 200.0, 1e4, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let all = [(1, 1), (63, 48), (65, 65), (5, 257), (4097, 128)];
    let mut inputs: Vec<(String, usize, usize, Vec<f32>, u64)> = all[..size.pick(5, 4)]
        .iter()
        .map(|&(r, f)| (format!("{r}x{f}"), r, f, random((r * 1000 + f) as u64 + 11, r * 2 * f, 6.0), (r * 1000 + f) as u64))
        .collect();
    inputs.push(("1x6 saturated".into(), 1, 6, saturated.to_vec(), 99));
    let mut fwd = Check::new("swiglu_forward", tolerance);
    for (tag, rows, f, gate_up, _) in &inputs {
        let (o, mut want) = (dev.alloc(rows * f, "selftest")?, vec![0.0; rows * f]);
        dev.swiglu_forward(&o, &upload(dev, gate_up)?, *rows, *f);
        swiglu::swiglu_forward(&mut want, gate_up, *rows, *f);
        fwd.compare(tag, &dev.read(&o), &want);
    }
    let fwd = fwd.finish();
    let mut bwd = Check::new("swiglu_backward", tolerance);
    for (tag, rows, f, gate_up, seed) in &inputs {
        let (dout, mut dgu) = (random(seed + 1, rows * f, 1.0), random(seed + 2, rows * 2 * f, 100.0));
        let tdgu = upload(dev, &dgu)?;
        dev.swiglu_backward(&tdgu, &upload(dev, &dout)?, &upload(dev, gate_up)?, *rows, *f);
        swiglu::swiglu_backward(&mut dgu, &dout, gate_up, *rows, *f);
        bwd.compare(tag, &dev.read(&tdgu), &dgu);
    }
    Ok(vec![fwd, bwd.finish()])
}

/// GPT-2's encoder: out = wte[token] + wpe[t], and the backward's scatter-add into non-zero dwte and
/// dwpe (repeated tokens sum; a vocabulary of 4097 rows).
pub fn check_encoder<D: Backend>(dev: &D, _size: Size) -> Result<Vec<CheckResult>> {
    let tolerance = Tolerance::close(1e-5, 1e-5);
    let shapes = [(1, 1, 1, 1), (2, 33, 5, 4097), (3, 7, 65, 63)];
    let inputs = |(batch, seq_len, c, vocab): (usize, usize, usize, usize)| {
        let seed = (batch + seq_len * 10 + c * 100 + vocab) as u64;
        let ids = random_tokens(seed, batch * seq_len, vocab);
        let (wte, wpe) = (random(seed + 1, vocab * c, 1.0), random(seed + 2, seq_len * c, 1.0));
        (format!("B{batch} T{seq_len} C{c} V{vocab}"), ids, wte, wpe, seed)
    };
    let mut fwd = Check::new("encoder_forward", tolerance);
    for (batch, seq_len, c, vocab) in shapes {
        let (tag, ids, wte, wpe, _) = inputs((batch, seq_len, c, vocab));
        let (o, mut want) = (dev.alloc(batch * seq_len * c, "selftest")?, vec![0.0; batch * seq_len * c]);
        dev.encoder_forward(&o, &dev.tokens(&ids)?, &upload(dev, &wte)?, &upload(dev, &wpe)?, seq_len, c);
        encoder::encoder_forward(&mut want, &ids, &wte, &wpe, seq_len, c);
        fwd.compare(&tag, &dev.read(&o), &want);
    }
    let fwd = fwd.finish();
    let mut bwd = Check::new("encoder_backward", tolerance);
    for (batch, seq_len, c, vocab) in shapes {
        let (tag, ids, mut dwte, mut dwpe, seed) = inputs((batch, seq_len, c, vocab));
        let dout = random(seed + 3, batch * seq_len * c, 1.0);
        let (twte, twpe) = (upload(dev, &dwte)?, upload(dev, &dwpe)?);
        dev.encoder_backward(&twte, &twpe, &upload(dev, &dout)?, &dev.tokens(&ids)?, batch, seq_len, c);
        encoder::encoder_backward(&mut dwte, &mut dwpe, &dout, &encoder::TokenBuckets::new(&ids), batch, seq_len, c);
        bwd.compare(&format!("dwte {tag}"), &dev.read(&twte), &dwte);
        bwd.compare(&format!("dwpe {tag}"), &dev.read(&twpe), &dwpe);
    }
    Ok(vec![fwd, bwd.finish()])
}

/// The whole-row cross-entropy: losses with the logits left alone, then losses and the gradient
/// written over the logits.
pub fn check_crossentropy<D: Backend>(dev: &D, _size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new("crossentropy", Tolerance::close(1e-5, 1e-5));
    for (rows, vocab) in [(1, 1), (66, 4097), (21, 63), (3, 50257)] {
        let tag = format!("rows {rows} V {vocab}");
        let seed = (rows * 7 + vocab) as u64;
        let ids = random_tokens(seed, rows, vocab);
        let toks = dev.tokens(&ids)?;
        let logits0 = random(seed + 4, rows * vocab, 8.0);
        let (logits, losses) = (upload(dev, &logits0)?, dev.alloc(rows, "selftest")?);
        let (mut want_logits, mut want_losses) = (logits0.clone(), vec![0.0; rows]);
        dev.crossentropy(&losses, &logits, &toks, vocab, None);
        ce::crossentropy(&mut want_losses, &mut want_logits, &ids, vocab, None);
        check.compare(&format!("losses {tag}"), &dev.read(&losses), &want_losses);
        check.compare(&format!("logits untouched {tag}"), &dev.read(&logits), &want_logits);
        let scale = 1.0 / rows as f32;
        dev.crossentropy(&losses, &logits, &toks, vocab, Some(scale));
        ce::crossentropy(&mut want_losses, &mut want_logits, &ids, vocab, Some(scale));
        check.compare(&format!("losses with gradient {tag}"), &dev.read(&losses), &want_losses);
        check.compare(&format!("dlogits {tag}"), &dev.read(&logits), &want_logits);
    }
    Ok(vec![check.finish()])
}

/// The chunks of a (rows, V) matrix of `chunk_cols` columns: windows of the whole matrix (offset =
/// start, row stride V).
fn chunks(rows: usize, vocab: usize, chunk_cols: usize) -> Vec<VocabChunk> {
    let n_chunks = vocab.div_ceil(chunk_cols);
    (0..n_chunks)
        .map(|index| {
            let (start, cols) = (index * chunk_cols, chunk_cols.min(vocab - index * chunk_cols));
            VocabChunk { rows, start, cols, index, n_chunks, offset: start, row_stride: vocab }
        })
        .collect()
}

/// Both kernels of the chunked loss, in both layouts (a window of the whole matrix and a chunk-sized
/// scratch): every chunk's statistics, then every chunk's gradient from the twin's combined lse.
/// (V, chunk columns): one column, chunks that do not divide V, GPT-2's vocabulary in chunks of 8192
/// and 20000; targets in the first and last columns.
pub fn check_crossentropy_chunks<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    // Maxima and target logits are exact; the sums of exp are in other orders, and the twin's is one
    // f32 chain over up to 20000 columns (about 3e-5 from a tree's sum, where tests/kernels.rs's
    // 2e-5 holds the GPU to the cpu device's lane sums); the gradients take the twin's lse.
    let (tolerance, stats_tolerance) = (Tolerance::close(1e-7, 2e-5), Tolerance::close(1e-7, 1e-4));
    let all = [(1, 1), (17, 5), (1001, 300), (50257, 8192), (50257, 20000)];
    let cases: Vec<(usize, usize, usize)> =
        [1, 3, 37].iter().flat_map(|&rows| all[..size.pick(5, 3)].iter().map(move |&(v, cols)| (rows, v, cols))).collect();
    let inputs = |&(rows, vocab, chunk_cols): &(usize, usize, usize)| {
        let seed = (rows * 100_003 + vocab * 7 + chunk_cols) as u64;
        let mut ids = random_tokens(seed + 1, rows, vocab);
        ids[0] = vocab as u32 - 1; // in the last, shorter chunk
        if rows > 1 {
            ids[1] = 0;
        }
        (format!("rows {rows} V {vocab} chunk {chunk_cols}"), random(seed, rows * vocab, 8.0), ids, chunks(rows, vocab, chunk_cols))
    };
    let mut stats_check = Check::new("crossentropy_chunk_stats", stats_tolerance);
    for case in &cases {
        let (tag, logits, ids, chunks) = inputs(case);
        chunk_stats(dev, &mut stats_check, &tag, &logits, &ids, &chunks)?;
    }
    let stats_result = stats_check.finish();
    let mut grad_check = Check::new("crossentropy_chunk_grad", tolerance);
    for case in &cases {
        let (tag, logits, ids, chunks) = inputs(case);
        chunk_grads(dev, &mut grad_check, &tag, &logits, &ids, &chunks)?;
    }
    Ok(vec![stats_result, grad_check.finish()])
}

/// Each chunk's columns of every row, as a chunk-sized scratch (row stride = columns), and its chunk.
fn scratch(matrix: &[f32], chunk: &VocabChunk) -> (Vec<f32>, VocabChunk) {
    let data = (0..chunk.rows).flat_map(|r| matrix[chunk.at(r, 0)..chunk.at(r, chunk.cols)].iter().copied()).collect();
    (data, VocabChunk { offset: 0, row_stride: chunk.cols, ..*chunk })
}

fn chunk_stats<D: Backend>(dev: &D, check: &mut Check, tag: &str, logits: &[f32], ids: &[u32], chunks: &[VocabChunk]) -> Result<()> {
    let (rows, n_chunks) = (chunks[0].rows, chunks.len());
    let (toks, whole) = (dev.tokens(ids)?, upload(dev, logits)?);
    let (whole_stats, scratch_stats) = (dev.alloc(rows * n_chunks * 3, "selftest")?, dev.alloc(rows * n_chunks * 3, "selftest")?);
    let mut want = vec![0.0; rows * n_chunks * 3];
    for chunk in chunks {
        dev.crossentropy_chunk_stats(&whole_stats, &whole, &toks, chunk);
        let (data, scratch_chunk) = scratch(logits, chunk);
        dev.crossentropy_chunk_stats(&scratch_stats, &upload(dev, &data)?, &toks, &scratch_chunk);
        ce::crossentropy_chunk_stats(&mut want, logits, ids, chunk);
    }
    check.compare(&format!("whole matrix, {tag}"), &dev.read(&whole_stats), &want);
    check.compare(&format!("scratch, {tag}"), &dev.read(&scratch_stats), &want);
    Ok(())
}

fn chunk_grads<D: Backend>(dev: &D, check: &mut Check, tag: &str, logits: &[f32], ids: &[u32], chunks: &[VocabChunk]) -> Result<()> {
    let (rows, n_chunks) = (chunks[0].rows, chunks.len());
    let mut stats = vec![0.0; rows * n_chunks * 3];
    chunks.iter().for_each(|chunk| ce::crossentropy_chunk_stats(&mut stats, logits, ids, chunk));
    let (lse, _) = ce::crossentropy_combine(&stats, rows, n_chunks);
    let (toks, whole, tlse, grad_scale) = (dev.tokens(ids)?, upload(dev, logits)?, upload(dev, &lse)?, 1.0 / rows as f32);
    let (mut want, mut from_scratch) = (logits.to_vec(), vec![0.0; logits.len()]);
    for chunk in chunks {
        dev.crossentropy_chunk_grad(&whole, &tlse, &toks, chunk, grad_scale);
        let (data, scratch_chunk) = scratch(logits, chunk);
        let t = upload(dev, &data)?;
        dev.crossentropy_chunk_grad(&t, &tlse, &toks, &scratch_chunk, grad_scale);
        for (r, grads) in dev.read(&t).chunks(chunk.cols).enumerate() {
            from_scratch[chunk.at(r, 0)..chunk.at(r, chunk.cols)].copy_from_slice(grads);
        }
        ce::crossentropy_chunk_grad(&mut want, &lse, ids, chunk, grad_scale);
    }
    check.compare(&format!("whole matrix, {tag}"), &dev.read(&whole), &want);
    check.compare(&format!("scratch, {tag}"), &from_scratch, &want);
    Ok(())
}
