//! `bench kernels`' kernels between the products: attention (GFLOP/s) and the memory-bound ones (GB/s):
//! layer norm, the element-wise ops, embeddings and the cross-entropy, whole and by vocabulary chunk.

use std::collections::HashSet;

use anyhow::Result;

use super::{Bench, Bound, Case, f32_bytes, random_ids, random_tensor, random_values};
use crate::device::{Activation, AttentionDims, Backend, VocabChunk};
use zerostream_shaders::AttentionPass;

impl Bench<'_> {
    /// Causal attention forward and backward. FLOPs count the causal half only: forward 4 x hd per
    /// (query, key) pair (q.k and p.v), backward 2.5 times that (FlashAttention's convention).
    pub(super) fn attention(&mut self, d: AttentionDims, layers: usize) -> Result<()> {
        if !self.wants("attention") {
            return Ok(());
        }
        let dev = self.dev;
        let (bt, c, stat) = (d.batch * d.seq_len, d.out_width(), d.stat_len());
        let qkv = random_tensor(dev, bt * d.qkv_width(), 8, "qkv")?;
        let (out, lse) = (dev.alloc(bt * c, "attention out")?, dev.alloc(stat, "lse")?);
        let dout = random_tensor(dev, bt * c, 9, "d attention out")?;
        let (dqkv, delta) = (dev.alloc(bt * d.qkv_width(), "d qkv")?, dev.alloc(stat, "delta")?);
        let pairs = (d.seq_len * (d.seq_len + 1) / 2) as f64;
        let forward_flops = 4.0 * (d.batch * d.heads * d.head_dim) as f64 * pairs;
        let shape = format!("B={} T={} NH={} hd={}", d.batch, d.seq_len, d.heads, d.head_dim);
        // Each row names the variant that ran (the tuning table's choice, else the untuned one).
        let compute = |kernel, pass, flops, bytes| Case {
            kernel,
            case: "causal self-attention".into(),
            shape: shape.clone(),
            precision: "fp32",
            bound: Bound::Compute,
            flops,
            bytes,
            per_step: layers,
            variant: Some(dev.attention_variant_for(pass, &d).name()),
        };
        let forward = compute("attention_forward", AttentionPass::Forward, forward_flops, f32_bytes(4 * bt * c + stat));
        self.time(forward, || dev.attention_forward(&out, &lse, &qkv, d))?;
        let backward_bytes = f32_bytes(6 * bt * c + 2 * bt * c + 2 * stat);
        let backward = compute("attention_backward", AttentionPass::Backward, 2.5 * forward_flops, backward_bytes);
        self.time(backward, || dev.attention_backward(&dqkv, &delta, &dout, &qkv, &out, &lse, d))
    }

    /// Layer norm forward and backward over (BT, C); the backward accumulates into dx, dweight, dbias.
    pub(super) fn layernorm(&mut self, bt: usize, c: usize, per_step: usize) -> Result<()> {
        if !self.wants("layernorm") {
            return Ok(());
        }
        let dev = self.dev;
        let x = random_tensor(dev, bt * c, 10, "x")?;
        let (weight, bias) = (random_tensor(dev, c, 11, "ln weight")?, random_tensor(dev, c, 12, "ln bias")?);
        let (out, mean, rstd) = (dev.alloc(bt * c, "ln out")?, dev.alloc(bt, "mean")?, dev.alloc(bt, "rstd")?);
        let dout = random_tensor(dev, bt * c, 13, "d ln out")?;
        let (dx, dweight, dbias) = (dev.alloc(bt * c, "dx")?, dev.alloc(c, "d ln weight")?, dev.alloc(c, "d ln bias")?);
        let shape = format!("BT={bt} C={c}");
        let forward =
            Case::memory("layernorm_forward", "ln_1, ln_2, ln_f", shape.clone(), f32_bytes(2 * bt * c + 2 * bt + 2 * c), per_step);
        self.time(forward, || dev.layernorm_forward(&out, &mean, &rstd, &x, &weight, &bias, bt, c, 1e-5))?;
        let backward = Case::memory("layernorm_backward", "ln_1, ln_2, ln_f", shape, f32_bytes(4 * bt * c + 2 * bt + 5 * c), per_step);
        self.time(backward, || dev.layernorm_backward(&dx, &dweight, &dbias, &dout, &x, &weight, &mean, &rstd, bt, c))
    }

    /// GELU over the MLP's hidden activations, the residual additions, the zeroing of a gradient buffer,
    /// axpy, and the 16-bit casts.
    pub(super) fn elementwise(&mut self, bt: usize, c: usize, hidden: usize, layers: usize) -> Result<()> {
        let dev = self.dev;
        let (nh, nc) = (bt * hidden, bt * c);
        let (h_shape, c_shape) = (format!("{nh} = BT x 4C"), format!("{nc} = BT x C"));
        if self.wants("gelu") {
            let x = random_tensor(dev, nh, 14, "gelu x")?;
            let (out, dout, dx) = (dev.alloc(nh, "gelu out")?, random_tensor(dev, nh, 15, "d gelu out")?, dev.alloc(nh, "gelu dx")?);
            let forward = Case::memory("gelu_forward", "mlp", h_shape.clone(), f32_bytes(2 * nh), layers);
            self.time(forward, || dev.activation_forward(Activation::GeluTanh, &out, &x))?;
            let backward = Case::memory("gelu_backward", "mlp (dx +=)", h_shape.clone(), f32_bytes(4 * nh), layers);
            self.time(backward, || dev.activation_backward(Activation::GeluTanh, &dx, &x, &dout))?;
        }
        let a = random_tensor(dev, nc, 16, "a")?;
        let y = random_tensor(dev, nc, 17, "b")?;
        if self.wants("residual") {
            let out = dev.alloc(nc, "residual out")?;
            let case = Case::memory("residual_forward", "residual stream", c_shape.clone(), f32_bytes(3 * nc), 2 * layers);
            self.time(case, || dev.residual_forward(&out, &a, &y))?;
        }
        if self.wants("axpy") {
            let case = Case::memory("axpy", "y = a x + b y (not in the step)", c_shape.clone(), f32_bytes(3 * nc), 0);
            self.time(case, || dev.axpy(&y, 0.5, &a, 0.5))?;
        }
        if self.wants("fill") {
            let buffer = dev.alloc(nh, "fill target")?;
            let case = Case::memory("fill", "zero d_hidden", h_shape, f32_bytes(nh), layers);
            self.time(case, || dev.fill(&buffer, 0.0))?;
        }
        if self.wants("cast") {
            let values = random_values(nc, 1.0, 18);
            let bits: Vec<u16> = values.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
            let words: Vec<u32> = bits.chunks(2).map(|p| p[0] as u32 | (p.get(1).copied().unwrap_or(0) as u32) << 16).collect();
            let packed = dev.upload_words(&words, "bf16 words")?;
            let wide = dev.alloc(nc, "widened")?;
            let case = Case::memory("cast_half_to_f32", "bf16 upload widening", c_shape.clone(), 6.0 * nc as f64, 0);
            self.time(case, || dev.cast_bf16_to_f32(&wide, &packed, nc))?;
            let case = Case::memory("cast_f32_to_f16", "f32 to f16 (not in the step)", c_shape, 6.0 * nc as f64, 0);
            self.time(case, || dev.cast_f32_to_f16(&packed, &a, nc))?;
        }
        Ok(())
    }

    /// Token and position embedding forward, and its backward (the gather's scatter, by token bucket).
    pub(super) fn embeddings(&mut self, b: usize, t: usize, c: usize, v: usize) -> Result<()> {
        if !self.wants("encoder") {
            return Ok(());
        }
        let dev = self.dev;
        let bt = b * t;
        let ids = random_ids(bt, v, 19);
        let distinct = ids.iter().collect::<HashSet<_>>().len();
        let tokens = dev.tokens(&ids)?;
        let (wte, wpe) = (random_tensor(dev, v * c, 20, "wte")?, random_tensor(dev, t * c, 21, "wpe")?);
        let out = dev.alloc(bt * c, "embedded")?;
        let dout = random_tensor(dev, bt * c, 22, "d embedded")?;
        let (dwte, dwpe) = (dev.alloc(v * c, "d wte")?, dev.alloc(t * c, "d wpe")?);
        let shape = format!("B={b} T={t} C={c} V={v}");
        // Forward reads each token's row and the position rows and writes (BT, C); backward reads
        // d(out) once and reads and writes each distinct token's row and the position rows.
        let forward = Case::memory("encoder_forward", "wte[tokens] + wpe", shape.clone(), f32_bytes(2 * bt * c + t * c + bt), 1);
        self.time(forward, || dev.encoder_forward(&out, &tokens, &wte, &wpe, t, c))?;
        let backward_bytes = f32_bytes(bt * c + 2 * distinct * c + 2 * t * c + 2 * bt);
        let backward = Case::memory("encoder_backward", "dwte, dwpe +=", shape, backward_bytes, 1);
        self.time(backward, || dev.encoder_backward(&dwte, &dwpe, &dout, &tokens, b, t, c))
    }

    /// The fused softmax cross-entropy over whole rows (what training ran before the loss went by
    /// vocabulary chunks; not counted in the step).
    pub(super) fn crossentropy(&mut self, bt: usize, v: usize) -> Result<()> {
        if !self.wants("crossentropy") {
            return Ok(());
        }
        let dev = self.dev;
        let logits = dev.alloc(bt * v, "logits")?;
        dev.write(&logits, &random_values(bt * v, 4.0, 23));
        let targets = dev.tokens(&random_ids(bt, v, 24))?;
        let losses = dev.alloc(bt, "losses")?;
        let case = Case::memory(
            "crossentropy",
            "softmax + loss + dlogits (not in the step)",
            format!("BT={bt} V={v}"),
            f32_bytes(2 * bt * v + 2 * bt),
            0,
        );
        // Each repetition reads the previous one's gradients as logits: other values, same work.
        self.time(case, || dev.crossentropy(&losses, &logits, &targets, v, Some(1.0 / bt as f32)))
    }

    /// The vocabulary-chunked cross-entropy's two kernels (what training runs, `model::vocab`) on the
    /// first chunk of CHUNK_COLS columns of the (BT, V) logits (row stride V, as when the whole matrix
    /// is kept), counted once per chunk in the step.
    pub(super) fn crossentropy_chunks(&mut self, bt: usize, v: usize) -> Result<()> {
        const CHUNK_COLS: usize = crate::model::vocab::DEFAULT_CHUNK_ROWS;
        if !self.wants("crossentropy_chunk_stats") && !self.wants("crossentropy_chunk_grad") {
            return Ok(());
        }
        let dev = self.dev;
        let logits = dev.alloc(bt * v, "logits")?;
        dev.write(&logits, &random_values(bt * v, 4.0, 25));
        let targets = dev.tokens(&random_ids(bt, v, 26))?;
        let (cols, n_chunks) = (CHUNK_COLS.min(v), v.div_ceil(CHUNK_COLS));
        let chunk = VocabChunk { rows: bt, start: 0, cols, index: 0, n_chunks, offset: 0, row_stride: v };
        let shape = format!("BT={bt} cols={cols} V={v}");
        if self.wants("crossentropy_chunk_stats") {
            let stats = dev.alloc(bt * n_chunks * 3, "chunk stats")?;
            let bytes = f32_bytes(bt * cols + 3 * bt + bt);
            let case = Case::memory("crossentropy_chunk_stats", "max, sum exp, target", shape.clone(), bytes, n_chunks);
            self.time(case, || dev.crossentropy_chunk_stats(&stats, &logits, &targets, &chunk))?;
        }
        if self.wants("crossentropy_chunk_grad") {
            // An lse near the logits' own keeps exp(x - lse) in range repetition after repetition.
            let lse = dev.alloc(bt, "lse")?;
            dev.write(&lse, &vec![12.0; bt]);
            let case = Case::memory("crossentropy_chunk_grad", "dlogits in place", shape, f32_bytes(2 * bt * cols + 2 * bt), n_chunks);
            self.time(case, || dev.crossentropy_chunk_grad(&logits, &lse, &targets, &chunk, 1.0 / bt as f32))?;
        }
        Ok(())
    }
}
