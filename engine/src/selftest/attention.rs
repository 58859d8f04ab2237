//! The attention checks: the training kernels forward and backward (multi-head and grouped-query, the
//! tiled kernels' 32-row edges, head dims from 1 to the largest, explicit scales, dropout on the
//! probabilities) and generation's decode attention over a key/value cache.

use anyhow::Result;

use super::{Check, CheckResult, Size, Tolerance, random, upload};
use crate::device::{AttentionDims, Backend, DecodeDims, DropoutMask};
use crate::ops::attention::{self as twin, MAX_HEAD_DIM};
use crate::ops::attention_decode::attention_decode;

/// `tests/kernels.rs`'s tolerance for attention: sums of T exponentials in other orders.
const TOLERANCE: Tolerance = Tolerance::close(1e-4, 1e-4);
/// The decode attention sums in the twin's own order.
const DECODE_TOLERANCE: Tolerance = Tolerance::close(1e-5, 1e-5);

/// (batch, T, H, G, D, scale (0: 1/sqrt(D)), dropout p (0: none), in the quick run too).
type Case = (usize, usize, usize, usize, usize, f32, f64, bool);

/// Single elements; T below, at and past the kernels' 32-row blocks; head dims of part of one
/// 32-channel chunk up to the largest; multi-head, grouped and multi-query; scale 1 (GPT-2 without
/// `scale_attn_weights`) and a layer-scaled one; T of many tiles; dropout at several rates.
const CASES: [Case; 17] = [
    (1, 1, 1, 1, 1, 0.0, 0.0, true),
    (2, 5, 3, 3, 7, 1.0, 0.0, true),
    (3, 17, 4, 4, 16, 0.0, 0.0, true),
    (2, 7, 4, 2, 7, 0.0, 0.0, true),
    (2, 31, 3, 3, 64, 0.0, 0.0, true),
    (2, 32, 6, 1, 128, 0.0, 0.0, true),
    (2, 33, 4, 2, 64, 0.0, 0.0, true),
    (2, 65, 3, 3, 7, 0.0, 0.0, true),
    (1, 17, 8, 8, 80, 0.0, 0.0, true),
    (1, 17, 3, 1, 32, 0.0, 0.0, true),
    (3, 17, 4, 4, 12, 0.0, 0.1, true),
    (2, 33, 3, 1, 7, 0.0, 0.4, true),
    (2, 130, 6, 1, 128, 0.0, 0.0, false),
    (3, 65, 4, 1, MAX_HEAD_DIM, 0.0, 0.0, false),
    (1, 300, 2, 2, 64, 0.0, 0.0, false),
    (1, 260, 3, 1, 80, 0.0962, 0.0, false),
    (2, 130, 4, 2, 128, 0.0, 0.2, false),
];

fn cases(size: Size) -> impl Iterator<Item = (usize, AttentionDims, String)> {
    CASES.iter().enumerate().filter(move |(_, c)| size == Size::Full || c.7).map(|(i, &(batch, t, h, g, d, scale, p, _))| {
        let mut dims = AttentionDims::gqa(batch, t, h, g, d).with_dropout(DropoutMask::new(p, 77 + i as u64));
        if scale != 0.0 {
            dims = dims.with_scale(scale);
        }
        let tag = format!(
            "B{batch} T{t} H{h} G{g} D{d}{}{}",
            if scale != 0.0 { format!(" scale {scale}") } else { String::new() },
            if p > 0.0 { format!(" dropout {p}") } else { String::new() }
        );
        (i, dims, tag)
    })
}

/// The twin's forward of case `i`: (qkv, out, lse).
fn twin_forward(i: usize, d: AttentionDims) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = d.batch * d.seq_len;
    let qkv = random(300 + i as u64, rows * d.qkv_width(), 1.5);
    let (mut out, mut lse) = (vec![0.0; rows * d.out_width()], vec![0.0; d.stat_len()]);
    twin::attention_forward(&mut out, &mut lse, &qkv, d);
    (qkv, out, lse)
}

/// out and lse of every case, as the check `label` (`attention_forward`, or a variant's).
pub fn check_forward<D: Backend>(dev: &D, label: &str, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new(label, TOLERANCE);
    for (i, d, tag) in cases(size) {
        if let Err(e) = dev.check_attention(d) {
            check.fail(format!("{tag} refused: {e:#}"));
            continue;
        }
        let (qkv, want_out, want_lse) = twin_forward(i, d);
        let (out, lse) = device_forward(dev, &qkv, d)?;
        check.compare(&format!("out {tag}"), &out, &want_out);
        check.compare(&format!("lse {tag}"), &lse, &want_lse);
    }
    Ok(vec![check.finish()])
}

/// The device's forward of `qkv`: (out, lse).
fn device_forward<D: Backend>(dev: &D, qkv: &[f32], d: AttentionDims) -> Result<(Vec<f32>, Vec<f32>)> {
    let rows = d.batch * d.seq_len;
    let (out, lse) = (dev.alloc(rows * d.out_width(), "selftest out")?, dev.alloc(d.stat_len(), "selftest lse")?);
    dev.attention_forward(&out, &lse, &upload(dev, qkv)?, d);
    Ok((dev.read(&out), dev.read(&lse)))
}

/// The backward's inputs for case `i` (the twin's forward), and the garbage its outputs start as.
struct BackwardCase {
    qkv: Vec<f32>,
    out: Vec<f32>,
    lse: Vec<f32>,
    dout: Vec<f32>,
    dqkv0: Vec<f32>,
    delta0: Vec<f32>,
}

impl BackwardCase {
    fn new(i: usize, d: AttentionDims) -> Self {
        let (qkv, out, lse) = twin_forward(i, d);
        let dout = random(400 + i as u64, d.batch * d.seq_len * d.out_width(), 1.0);
        let (dqkv0, delta0) = (random(500 + i as u64, qkv.len(), 9.0), random(600 + i as u64, lse.len(), 9.0));
        BackwardCase { qkv, out, lse, dout, dqkv0, delta0 }
    }

    /// The device's backward, written over the garbage: (dqkv, delta).
    fn on<D: Backend>(&self, dev: &D, d: AttentionDims) -> Result<(Vec<f32>, Vec<f32>)> {
        let (dqkv, delta) = (upload(dev, &self.dqkv0)?, upload(dev, &self.delta0)?);
        let inputs = (upload(dev, &self.dout)?, upload(dev, &self.qkv)?, upload(dev, &self.out)?, upload(dev, &self.lse)?);
        dev.attention_backward(&dqkv, &delta, &inputs.0, &inputs.1, &inputs.2, &inputs.3, d);
        Ok((dev.read(&dqkv), dev.read(&delta)))
    }
}

/// Every case's out, lse, dqkv and delta on `dev` as it stands (the variant forced), named: for holding
/// one variant's bits to another's. Cases the device refuses are left out.
pub fn outputs<D: Backend>(dev: &D, size: Size) -> Result<Vec<(String, Vec<f32>)>> {
    let mut all = Vec::new();
    for (i, d, tag) in cases(size).filter(|(_, d, _)| dev.check_attention(*d).is_ok()) {
        let case = BackwardCase::new(i, d);
        let (out, lse) = device_forward(dev, &case.qkv, d)?;
        let (dqkv, delta) = case.on(dev, d)?;
        all.extend([("out", out), ("lse", lse), ("dqkv", dqkv), ("delta", delta)].map(|(name, v)| (format!("{name} {tag}"), v)));
    }
    Ok(all)
}

/// dqkv and delta of every case, from the twin's forward, written over garbage (both are overwritten),
/// as the check `label`.
pub fn check_backward<D: Backend>(dev: &D, label: &str, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new(label, TOLERANCE);
    for (i, d, tag) in cases(size) {
        if let Err(e) = dev.check_attention(d) {
            check.fail(format!("{tag} refused: {e:#}"));
            continue;
        }
        let case = BackwardCase::new(i, d);
        let (dqkv, delta) = case.on(dev, d)?;
        let BackwardCase { qkv, out, lse, dout, dqkv0: mut want_dqkv, delta0: mut want_delta } = case;
        twin::attention_backward(&mut want_dqkv, &mut want_delta, &dout, &qkv, &out, &lse, d);
        check.compare(&format!("dqkv {tag}"), &dqkv, &want_dqkv);
        check.compare(&format!("delta {tag}"), &delta, &want_delta);
    }
    Ok(vec![check.finish()])
}

/// Decode attention: each sequence fed as a prompt, two single rows and the rest, into a cache two rows
/// longer than needed; every call's output and the cache at the end. More keys than a workgroup has
/// lanes (300), grouped heads, the largest head dim.
pub fn check_decode<D: Backend>(dev: &D, size: Size) -> Result<Vec<CheckResult>> {
    let mut check = Check::new("attention_decode", DECODE_TOLERANCE);
    let all = [(7, 1, 1, 1), (40, 6, 2, 5), (19, 8, 1, 3), (5, 2, 1, MAX_HEAD_DIM), (300, 4, 1, 16)];
    for (i, &(t, heads, kv_heads, hd)) in all[..size.pick(5, 4)].iter().enumerate() {
        let attn = AttentionDims::gqa(1, t, heads, kv_heads, hd).with_scale(0.3);
        let tag = format!("T{t} H{heads} G{kv_heads} D{hd}");
        let qkv = random(700 + i as u64, t * attn.qkv_width(), 1.0);
        let capacity = t + 2;
        let cache = dev.alloc(capacity * 2 * attn.kv_width(), "selftest cache")?;
        let mut want_cache = vec![0.0; capacity * 2 * attn.kv_width()];
        let cuts = [0, t / 2, t / 2 + 1, t / 2 + 2, t];
        for w in cuts.windows(2).filter(|w| w[1] > w[0]) {
            let (past, n) = (w[0], w[1] - w[0]);
            let d = DecodeDims::new(AttentionDims { seq_len: n, ..attn }, past, capacity);
            if let Err(e) = dev.check_attention_decode(d) {
                check.fail(format!("{tag} refused: {e:#}"));
                break;
            }
            let rows = &qkv[past * attn.qkv_width()..][..n * attn.qkv_width()];
            let out = dev.alloc(n * attn.out_width(), "selftest out")?;
            dev.attention_decode(&out, &cache, &upload(dev, rows)?, d);
            let mut want = vec![0.0; n * attn.out_width()];
            attention_decode(&mut want, &mut want_cache, rows, d);
            check.compare(&format!("{tag} rows {past}..{}", past + n), &dev.read(&out), &want);
        }
        check.compare(&format!("{tag} cache"), &dev.read(&cache), &want_cache);
    }
    Ok(vec![check.finish()])
}
