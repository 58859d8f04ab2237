//! Llama one step at a time with a KV cache: the same kernels as `llama::block_forward` on the new rows
//! only, RoPE at the new rows' absolute positions, attention over the cached (rotated) keys and values.

use anyhow::{Result, bail};

use crate::device::{Backend, DecodeDims, MatmulShape, Operand};
use crate::model::llama::{self, Head, LlamaConfig, TiedHead, linear_into, qkv_widths};

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
        let n = dims.rows();
        debug_assert!(n <= a.rows && dims == decode_dims(cfg, n, dims.past, dims.capacity));
        let buffers = llama::ForwardBuffers {
            ln_1: (&a.ln, &a.rstd),
            qkv: &a.qkv,
            atty: &a.atty,
            attn_proj: &a.proj,
            residual_2: &a.residual_2,
            ln_2: (&a.ln, &a.rstd),
            gate_up: &a.gate_up,
            act: &a.act,
            down: &a.proj,
        };
        let (rotated_heads, (_, _, qkv_w)) = (cfg.num_attention_heads + cfg.num_key_value_heads, qkv_widths(cfg));
        let attend = |atty: &T, qkv: &T| {
            dev.rope_at(qkv, &self.inv_freq, dims.past, n, qkv_w, 0, rotated_heads, cfg.head_dim);
            dev.attention_decode(atty, cache, qkv, dims);
        };
        llama::layer_forward_with(dev, cfg, layer, &buffers, input, output, n, attend);
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
