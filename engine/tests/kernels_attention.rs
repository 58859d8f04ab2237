//! The attention kernels against their plain-Rust twin (the cpu device): training attention forward
//! and backward (multi-head, grouped-query, explicit scales, the tiles' edges), the decode attention of
//! generation with a KV cache, and the refusals of shapes the kernels cannot run, with the numbers.
//! Each case also runs with one binding limited to 64 KiB, so the paths that split large tensors
//! into windows are exercised at sizes a test can afford.

#[macro_use]
mod common;

use common::kernel_check::{Outputs, tensor};
use common::{assert_close, gpu_or_skip, random};
use zerostream::device::{AttentionDims, Backend, CpuDevice, DecodeDims};
use zerostream::ops::attention::MAX_HEAD_DIM;

fn attention_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    // (batch, seq_len, heads, head_dim): T of many 32-row tiles, odd head sizes, one head of 64.
    for (batch, seq_len, heads, hd) in [(1, 1, 1, 1), (2, 5, 3, 7), (1, 300, 2, 64), (3, 17, 4, 16)] {
        let c = heads * hd;
        let d = AttentionDims::mha(batch, seq_len, c, heads);
        let seed = (batch * 7 + seq_len * 31 + heads * 131 + hd) as u64;
        let qkv = tensor(dev, &random(seed, batch * seq_len * 3 * c, 1.5));
        let (o, lse) = (dev.alloc(batch * seq_len * c, "o").unwrap(), dev.alloc(batch * heads * seq_len, "lse").unwrap());
        dev.attention_forward(&o, &lse, &qkv, d);
        let tag = format!("B{batch} T{seq_len} NH{heads} hd{hd}");
        out.push((format!("out {tag}"), dev.read(&o)));
        out.push((format!("lse {tag}"), dev.read(&lse)));
        let dout = tensor(dev, &random(seed + 1, batch * seq_len * c, 1.0));
        let (dqkv, delta) = (dev.alloc(batch * seq_len * 3 * c, "dqkv").unwrap(), dev.alloc(batch * heads * seq_len, "delta").unwrap());
        dev.attention_backward(&dqkv, &delta, &dout, &qkv, &o, &lse, d);
        out.push((format!("dqkv {tag}"), dev.read(&dqkv)));
    }
    out
}

#[test]
fn attention_matches_twin() {
    check!("attention", attention_case, 1e-4, 1e-4);
}

/// An explicit softmax scale: 1 (GPT-2's `scale_attn_weights: false`), and 1/sqrt(D) / (l + 1)
/// (`scale_attn_by_inverse_layer_idx` at layer 2), read by both kernels from their Params.
fn attention_scale_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (batch, seq_len, heads, kv_heads, hd, scale) in [(2, 5, 3, 3, 7, 1.0), (1, 260, 4, 2, 12, 1.0 / (12f32.sqrt() * 3.0))] {
        let d = AttentionDims::gqa(batch, seq_len, heads, kv_heads, hd).with_scale(scale);
        let rows = batch * seq_len;
        let seed = (seq_len * 31 + hd) as u64;
        let qkv = tensor(dev, &random(seed, rows * d.qkv_width(), 1.0));
        let (o, lse) = (dev.alloc(rows * d.out_width(), "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
        dev.attention_forward(&o, &lse, &qkv, d);
        let tag = format!("B{batch} T{seq_len} H{heads} G{kv_heads} D{hd} scale {scale}");
        out.push((format!("out {tag}"), dev.read(&o)));
        out.push((format!("lse {tag}"), dev.read(&lse)));
        let dout = tensor(dev, &random(seed + 1, rows * d.out_width(), 1.0));
        let (dqkv, delta) = (dev.alloc(rows * d.qkv_width(), "dqkv").unwrap(), dev.alloc(d.stat_len(), "delta").unwrap());
        dev.attention_backward(&dqkv, &delta, &dout, &qkv, &o, &lse, d);
        out.push((format!("dqkv {tag}"), dev.read(&dqkv)));
    }
    out
}

#[test]
fn attention_with_explicit_scale_matches_twin() {
    check!("attention scale", attention_scale_case, 1e-4, 1e-4);
}

/// The scale is really used: scaling q by s with scale 1 is the default-scaled attention of q s sqrt(D).
#[test]
fn attention_scale_multiplies_the_scores() {
    let dev = CpuDevice::new(None);
    let (batch, seq_len, heads, hd) = (2, 9, 3, 8);
    let c = heads * hd;
    let qkv = random(77, batch * seq_len * 3 * c, 1.0);
    let mut scaled_q = qkv.clone();
    for row in scaled_q.chunks_mut(3 * c) {
        row[..c].iter_mut().for_each(|q| *q *= 0.25 * (hd as f32).sqrt());
    }
    let run = |qkv: &[f32], d: AttentionDims| {
        let (o, lse) = (dev.alloc(batch * seq_len * c, "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
        dev.attention_forward(&o, &lse, &tensor(&dev, qkv), d);
        dev.read(&o)
    };
    let d = AttentionDims::mha(batch, seq_len, c, heads);
    assert_close("scale 0.25 vs q scaled", &run(&qkv, d.with_scale(0.25)), &run(&scaled_q, d), 1e-5, 1e-5);
}

/// Grouped-query attention: every (heads, kv_heads) pair at every head dim up to the kernels' largest,
/// cycling through awkward T and B; and T of many 32-key tiles (300, 260, ending in partial ones), where
/// key_value_grad's loop over a group's heads restarts its query tiles.
fn gqa_attention_case<D: Backend>(dev: &D) -> Outputs {
    let mut cases = Vec::new();
    for (i, &(heads, kv_heads)) in [(4, 2), (4, 1), (6, 3), (8, 8), (3, 1)].iter().enumerate() {
        for (k, &head_dim) in [12, 32, 64, 80, 128, MAX_HEAD_DIM].iter().enumerate() {
            cases.push(AttentionDims::gqa([1, 3][(i + k) % 2], [1, 17, 65][(i + k) % 3], heads, kv_heads, head_dim));
        }
    }
    cases.push(AttentionDims::gqa(2, 300, 4, 2, 12));
    cases.push(AttentionDims::gqa(1, 260, 3, 1, 80));
    let mut out = Outputs::new();
    for d in cases {
        attention_outputs(dev, d, &mut out);
    }
    out
}

/// Forward and backward of `d` on seeded random inputs, with garbage in dqkv and delta (both must be
/// overwritten): out, lse, dqkv and delta.
fn attention_outputs<D: Backend>(dev: &D, d: AttentionDims, out: &mut Outputs) {
    let tag = format!("B{} T{} H{} G{} D{}", d.batch, d.seq_len, d.heads, d.kv_heads, d.head_dim);
    let seed = (d.batch * 7 + d.seq_len * 31 + d.heads * 131 + d.kv_heads * 17 + d.head_dim) as u64;
    let rows = d.batch * d.seq_len;
    let qkv = tensor(dev, &random(seed, rows * d.qkv_width(), 1.5));
    let (o, lse) = (dev.alloc(rows * d.out_width(), "o").unwrap(), dev.alloc(d.stat_len(), "lse").unwrap());
    dev.attention_forward(&o, &lse, &qkv, d);
    out.push((format!("out {tag}"), dev.read(&o)));
    out.push((format!("lse {tag}"), dev.read(&lse)));
    let dout = tensor(dev, &random(seed + 1, rows * d.out_width(), 1.0));
    let dqkv = tensor(dev, &random(seed + 2, rows * d.qkv_width(), 9.0));
    let delta = tensor(dev, &random(seed + 3, d.stat_len(), 9.0));
    dev.attention_backward(&dqkv, &delta, &dout, &qkv, &o, &lse, d);
    out.push((format!("dqkv {tag}"), dev.read(&dqkv)));
    out.push((format!("delta {tag}"), dev.read(&delta)));
}

/// The tiled kernels' edges: T below, at and past their 32-row blocks (1, 7, 31, 32, 33, 65, 130), head
/// dims of part of one 32-channel chunk (7), two and four chunks (GPT-2's 64, Llama's 128), grouped and
/// multi-head attention, two batches.
fn attention_tile_edges_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (i, &seq_len) in [1, 7, 31, 32, 33, 65, 130].iter().enumerate() {
        for (k, &head_dim) in [7, 64, 128].iter().enumerate() {
            let (heads, kv_heads) = [(4, 2), (3, 3), (6, 1)][(i + k) % 3];
            attention_outputs(dev, AttentionDims::gqa(2, seq_len, heads, kv_heads, head_dim), &mut out);
        }
    }
    out
}

#[test]
fn attention_at_tile_edges_matches_twin() {
    check!("attention tile edges", attention_tile_edges_case, 1e-4, 1e-4);
}

#[test]
fn gqa_attention_matches_twin() {
    check!("gqa attention", gqa_attention_case, 1e-4, 1e-4);
}

#[test]
fn attention_too_long_for_one_binding_is_refused_with_the_numbers() {
    let Some(mut gpu) = gpu_or_skip("attention binding check") else { return };
    gpu.limit_binding_bytes_for_tests(64 << 10);
    let long = AttentionDims::mha(2, 64, 128, 4);
    let err = gpu.check_attention(long).unwrap_err().to_string();
    assert!(err.contains("98304 bytes") && err.contains("--seq-len"), "{err}");
    assert!(gpu.check_attention(AttentionDims { seq_len: 32, ..long }).is_ok());
}

/// Decode attention: a sequence fed as a prompt, two single rows and the rest, against a cache two
/// rows longer than needed; every call's output, and the cache at the end. Head counts and dims as the
/// attention tests', 300 positions (more keys than a workgroup has lanes), and the largest head dim.
fn attention_decode_case<D: Backend>(dev: &D) -> Outputs {
    let mut out = Outputs::new();
    for (i, (t, heads, kv_heads, hd)) in
        [(7, 1, 1, 1), (40, 6, 2, 5), (300, 4, 1, 16), (19, 8, 1, 3), (5, 2, 1, MAX_HEAD_DIM)].into_iter().enumerate()
    {
        let attn = AttentionDims::gqa(1, t, heads, kv_heads, hd).with_scale(0.3);
        let qkv = random(300 + i as u64, t * attn.qkv_width(), 1.0);
        let capacity = t + 2;
        let cache = dev.alloc(capacity * 2 * attn.kv_width(), "cache").unwrap();
        let cuts = [0, t / 2, t / 2 + 1, t / 2 + 2, t];
        for w in cuts.windows(2) {
            let (past, n) = (w[0], w[1].max(w[0]) - w[0]);
            if n == 0 {
                continue;
            }
            let d = DecodeDims::new(AttentionDims { seq_len: n, ..attn }, past, capacity);
            let x = tensor(dev, &qkv[past * attn.qkv_width()..][..n * attn.qkv_width()]);
            let o = dev.alloc(n * attn.out_width(), "out").unwrap();
            dev.check_attention_decode(d).unwrap();
            dev.attention_decode(&o, &cache, &x, d);
            out.push((format!("T{t} H{heads} KV{kv_heads} D{hd}: rows {past}..{}", past + n), dev.read(&o)));
        }
        out.push((format!("T{t} H{heads} KV{kv_heads} D{hd}: cache"), dev.read(&cache)));
    }
    out
}

#[test]
fn attention_decode_matches_twin() {
    check!("attention decode", attention_decode_case, 1e-5, 1e-5);
}

/// A cache longer than one binding is refused with the numbers.
#[test]
fn attention_decode_cache_too_long_for_one_binding_is_refused() {
    let Some(mut gpu) = gpu_or_skip("attention decode binding check") else { return };
    gpu.limit_binding_bytes_for_tests(64 << 10);
    let d = DecodeDims::new(AttentionDims::gqa(1, 1, 4, 2, 16), 0, 1000);
    let err = gpu.check_attention_decode(d).unwrap_err().to_string();
    assert!(err.contains("key/value cache") && err.contains("positions fit"), "{err}");
    assert!(gpu.check_attention_decode(DecodeDims { capacity: 100, ..d }).is_ok());
}

#[test]
fn attention_head_dims_the_kernels_cannot_run_are_refused() {
    let Some(gpu) = gpu_or_skip("attention head dim check") else { return };
    assert!(gpu.check_attention(AttentionDims::gqa(1, 8, 4, 2, MAX_HEAD_DIM)).is_ok());
    let err = gpu.check_attention(AttentionDims::gqa(1, 8, 4, 2, MAX_HEAD_DIM + 1)).unwrap_err().to_string();
    assert!(err.contains(&format!("head dim {} is above the {MAX_HEAD_DIM}", MAX_HEAD_DIM + 1)), "{err}");
    let err = gpu.check_attention(AttentionDims::gqa(1, 8, 6, 4, 64)).unwrap_err().to_string();
    assert!(err.contains("6 query heads do not split into groups over 4"), "{err}");
}
