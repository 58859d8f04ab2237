//! Llama one step at a time with a KV cache: the same kernels as `llama::block_forward` on the new rows
//! only, RoPE at the new rows' absolute positions, attention over the cached (rotated) keys and values.

use anyhow::{Result, bail};

use crate::device::{Backend, DecodeDims, MatmulShape, Operand};
use crate::model::llama::{self, Head, LlamaConfig, TiedHead};

/// The head group and RoPE's inverse frequencies on the device.
pub struct Decoder<T> {
    cfg: LlamaConfig,
    head: Vec<T>,
    inv_freq: T, // (D/2)
}

/// Scratch for `rows` new rows, shared by every layer.
pub struct Acts<T> {
    rows: usize,
    no_positions: T, // (n, C) zeros: the embedding kernel adds a position row
    ln: T,           // (n, C) norm_1, then norm_2, then the final norm
    rstd: T,         // (n)
    qkv: T,          // (n, (H + 2KV) D)
    atty: T,         // (n, H D)
    proj: T,         // (n, C) o_proj, then down
    residual_2: T,   // (n, C)
    gate_up: T,      // (n, 2F)
    act: T,          // (n, F)
    logits: T,       // (V) of the last new row
}

/// Widths of the packed [q | k | v] row: (q, one of k or v, all).
fn qkv_widths(cfg: &LlamaConfig) -> (usize, usize, usize) {
    let (q, kv) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
    (q, kv, q + 2 * kv)
}

impl<T> Acts<T> {
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &LlamaConfig, rows: usize) -> Result<Self> {
        let (n, c, f) = (rows, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        let no_positions = dev.alloc(n * c, "decode no positions")?;
        dev.fill(&no_positions, 0.0);
        Ok(Acts {
            rows,
            no_positions,
            ln: dev.alloc(n * c, "decode norm")?,
            rstd: dev.alloc(n, "decode norm rstd")?,
            qkv: dev.alloc(n * qkv_w, "decode qkv")?,
            atty: dev.alloc(n * qw, "decode atty")?,
            proj: dev.alloc(n * c, "decode proj")?,
            residual_2: dev.alloc(n * c, "decode residual_2")?,
            gate_up: dev.alloc(n * 2 * f, "decode gate_up")?,
            act: dev.alloc(n * f, "decode swiglu")?,
            logits: dev.alloc(cfg.vocab_size, "decode logits")?,
        })
    }

    /// Device bytes of [`Acts::new`].
    pub fn bytes(cfg: &LlamaConfig, rows: usize) -> u64 {
        let (n, c, f) = (rows, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        4 * (n * (4 * c + 1 + qkv_w + qw + 3 * f) + cfg.vocab_size) as u64
    }
}

/// Floats of one layer's cache of `capacity` positions: (capacity, 2 KV D).
pub fn cache_len(cfg: &LlamaConfig, capacity: usize) -> usize {
    capacity * qkv_widths(cfg).1 * 2
}

pub fn decode_dims(cfg: &LlamaConfig, rows: usize, past: usize, capacity: usize) -> DecodeDims {
    DecodeDims::new(llama::attention_dims(cfg, 1, rows), past, capacity)
}

/// y[:, col..col + n] (rows of `ld`) = x (rows, k) @ W^T, W (n, k): `llama`'s `linear_into`.
fn linear_into(rows: usize, k: usize, n: usize, ld: usize, col: usize) -> MatmulShape {
    MatmulShape {
        m: rows,
        n,
        k,
        a: Operand::row_major(k),
        b: Operand::transposed(k),
        c: Operand { offset: col, row_stride: ld, col_stride: 1 },
    }
}

impl<T> Decoder<T> {
    /// Uploads the head group (`head`, in table order) and the inverse frequencies.
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &LlamaConfig, head: Vec<Vec<f32>>) -> Result<Self> {
        let specs = llama::head_specs(cfg);
        if head.len() != specs.len() {
            bail!("Llama head group: {} tensors given, {} expected", head.len(), specs.len());
        }
        let head = super::upload(dev, &specs, head)?;
        let inv_freq = dev.alloc(cfg.head_dim / 2, "rope inv_freq")?;
        dev.write(&inv_freq, &cfg.inv_freq());
        Ok(Decoder { cfg: cfg.clone(), head, inv_freq })
    }

    /// (embed_tokens, norm, lm_head): lm_head is the embedding when tied.
    fn parts(&self) -> (&T, &T, &T) {
        if self.cfg.tie_word_embeddings {
            let h = TiedHead::view(&self.head);
            (h.embed_tokens, h.norm, h.embed_tokens)
        } else {
            let h = Head::view(&self.head);
            (h.embed_tokens, h.norm, h.lm_head)
        }
    }

    /// x (n, C) = embed_tokens[ids] (positions enter through RoPE).
    pub fn embed<D: Backend<Tensor = T>>(&self, dev: &D, a: &Acts<T>, x: &T, tokens: &D::Tokens, rows: usize) {
        dev.encoder_forward(x, tokens, self.parts().0, &a.no_positions, rows, self.cfg.hidden_size);
    }

    /// One layer on the new rows, as `llama::block_forward` computes it, attention over `cache`.
    #[allow(clippy::too_many_arguments)]
    pub fn block<D: Backend<Tensor = T>>(&self, dev: &D, layer: &[T], a: &Acts<T>, cache: &T, input: &T, output: &T, dims: DecodeDims) {
        let cfg = &self.cfg;
        let (n, c, f, eps) = (dims.rows(), cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps as f32);
        debug_assert!(n <= a.rows && dims == decode_dims(cfg, n, dims.past, dims.capacity));
        let (qw, kvw, qkv_w) = qkv_widths(cfg);
        let llama::Layer { w, qkv_bias, o_bias, mlp_bias } = llama::Layer::view(cfg, layer);
        let (qb, kb, vb) = (qkv_bias.as_ref().map(|b| b.q), qkv_bias.as_ref().map(|b| b.k), qkv_bias.as_ref().map(|b| b.v));
        dev.rmsnorm_forward(&a.ln, &a.rstd, input, w.input_layernorm, n, c, eps);
        for (weight, bias, col, width) in [(w.q_proj, qb, 0, qw), (w.k_proj, kb, qw, kvw), (w.v_proj, vb, qw + kvw, kvw)] {
            dev.matmul(&a.qkv, &a.ln, weight, bias, &linear_into(n, c, width, qkv_w, col), false);
        }
        let rotated_heads = cfg.num_attention_heads + cfg.num_key_value_heads;
        dev.rope_at(&a.qkv, &self.inv_freq, dims.past, n, qkv_w, 0, rotated_heads, cfg.head_dim);
        dev.attention_decode(&a.atty, cache, &a.qkv, dims);
        dev.matmul(&a.proj, &a.atty, w.o_proj, o_bias.as_ref().map(|b| b.o), &linear_into(n, qw, c, c, 0), false);
        dev.residual_forward(&a.residual_2, input, &a.proj);
        dev.rmsnorm_forward(&a.ln, &a.rstd, &a.residual_2, w.post_attention_layernorm, n, c, eps);
        let (gb, ub, db) = (mlp_bias.as_ref().map(|b| b.gate), mlp_bias.as_ref().map(|b| b.up), mlp_bias.as_ref().map(|b| b.down));
        dev.matmul(&a.gate_up, &a.ln, w.gate_proj, gb, &linear_into(n, c, f, 2 * f, 0), false);
        dev.matmul(&a.gate_up, &a.ln, w.up_proj, ub, &linear_into(n, c, f, 2 * f, f), false);
        dev.swiglu_forward(&a.act, &a.gate_up, n, f);
        dev.matmul(&a.proj, &a.act, w.down_proj, db, &linear_into(n, f, c, c, 0), false);
        dev.residual_forward(output, &a.residual_2, &a.proj);
    }

    /// The logits (V) of the last of `rows` rows of the last layer's output x.
    pub fn logits<D: Backend<Tensor = T>>(&self, dev: &D, a: &Acts<T>, x: &T, rows: usize) -> Vec<f32> {
        let (c, v) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let (_, norm, lm_head) = self.parts();
        dev.rmsnorm_forward(&a.ln, &a.rstd, x, norm, rows, c, self.cfg.rms_norm_eps as f32);
        let last = Operand { offset: (rows - 1) * c, row_stride: c, col_stride: 1 };
        dev.matmul(&a.logits, &a.ln, lm_head, None, &MatmulShape { a: last, ..linear_into(1, c, v, v, 0) }, false);
        dev.read(&a.logits)
    }
}
