//! GPT-2 one step at a time with a KV cache: the same kernels as `gpt2::block_forward` on the new rows
//! only, with attention over the cached keys and values, and the position embedding of the new rows'
//! absolute positions.

use anyhow::{Result, bail};

use crate::device::{Backend, DecodeDims, MatmulShape, Operand};
use crate::model::gpt2::{self, Block, Gpt2Config};

/// The head group on the device, and wpe on the host: each step writes its new rows' positions.
pub struct Decoder<T> {
    cfg: Gpt2Config,
    head: Vec<T>,
    wpe: Vec<f32>, // (n_positions, C)
}

/// Scratch for `rows` new rows, shared by every block (nothing is kept for a backward).
pub struct Acts<T> {
    rows: usize,
    positions: T,  // (n, C) wpe rows of the new tokens' positions
    ln: T,         // (n, C) ln_1, then ln_2, then ln_f
    mean: T,       // (n)
    rstd: T,       // (n)
    qkv: T,        // (n, 3C)
    atty: T,       // (n, C)
    proj: T,       // (n, C) attn_proj, then fc_proj
    residual_2: T, // (n, C)
    fc: T,         // (n, 4C)
    fc_act: T,     // (n, 4C)
    logits: T,     // (V) of the last new row
}

impl<T> Acts<T> {
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &Gpt2Config, rows: usize) -> Result<Self> {
        let (n, c, h) = (rows, cfg.n_embd, cfg.hidden());
        Ok(Acts {
            rows,
            positions: dev.alloc(n * c, "decode positions")?,
            ln: dev.alloc(n * c, "decode ln")?,
            mean: dev.alloc(n, "decode ln mean")?,
            rstd: dev.alloc(n, "decode ln rstd")?,
            qkv: dev.alloc(n * 3 * c, "decode qkv")?,
            atty: dev.alloc(n * c, "decode atty")?,
            proj: dev.alloc(n * c, "decode proj")?,
            residual_2: dev.alloc(n * c, "decode residual_2")?,
            fc: dev.alloc(n * h, "decode fc")?,
            fc_act: dev.alloc(n * h, "decode fc activation")?,
            logits: dev.alloc(cfg.vocab_size, "decode logits")?,
        })
    }

    /// Device bytes of [`Acts::new`].
    pub fn bytes(cfg: &Gpt2Config, rows: usize) -> u64 {
        let (n, c, h) = (rows, cfg.n_embd, cfg.hidden());
        4 * (n * (8 * c + 2 + 2 * h) + cfg.vocab_size) as u64
    }
}

/// Floats of one layer's cache of `capacity` positions: (capacity, 2C).
pub fn cache_len(cfg: &Gpt2Config, capacity: usize) -> usize {
    capacity * 2 * cfg.n_embd
}

/// Block l's attention on `rows` new rows after `past` cached ones.
pub fn decode_dims(cfg: &Gpt2Config, l: usize, rows: usize, past: usize, capacity: usize) -> DecodeDims {
    DecodeDims::new(gpt2::block_attention_dims(cfg, 1, rows, l), past, capacity)
}

impl<T> Decoder<T> {
    /// Uploads the head group (`head`, in table order).
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &Gpt2Config, head: Vec<Vec<f32>>) -> Result<Self> {
        let specs = gpt2::head_specs(cfg);
        if head.len() != specs.len() {
            bail!("GPT-2 head group: {} tensors given, {} expected", head.len(), specs.len());
        }
        let wpe = head[1].clone();
        let head = super::upload(dev, &specs, head)?;
        Ok(Decoder { cfg: cfg.clone(), head, wpe })
    }

    /// x (n, C) = wte[ids] + wpe[first_position ..].
    pub fn embed<D: Backend<Tensor = T>>(&self, dev: &D, a: &Acts<T>, x: &T, tokens: &D::Tokens, rows: usize, first_position: usize) {
        let c = self.cfg.n_embd;
        dev.write(&a.positions, &self.wpe[first_position * c..(first_position + rows) * c]);
        let head = gpt2::head_view(&self.cfg, &self.head);
        dev.encoder_forward(x, tokens, head.wte, &a.positions, rows, c);
    }

    /// Block l on the new rows, as `gpt2::block_forward` computes it, attention over `cache`.
    #[allow(clippy::too_many_arguments)]
    pub fn block<D: Backend<Tensor = T>>(
        &self,
        dev: &D,
        l: usize,
        block: &[T],
        a: &Acts<T>,
        cache: &T,
        input: &T,
        output: &T,
        dims: DecodeDims,
    ) {
        let cfg = &self.cfg;
        let w = Block::view(block);
        let n = dims.rows();
        debug_assert!(n <= a.rows && dims == decode_dims(cfg, l, n, dims.past, dims.capacity));
        let buffers = gpt2::ForwardBuffers {
            ln_1: (&a.ln, &a.mean, &a.rstd),
            qkv: &a.qkv,
            atty: &a.atty,
            attn_proj: &a.proj,
            residual_2: &a.residual_2,
            ln_2: (&a.ln, &a.mean, &a.rstd),
            fc: &a.fc,
            fc_act: &a.fc_act,
            fc_proj: &a.proj,
        };
        let attend = |atty: &T, qkv: &T| dev.attention_decode(atty, cache, qkv, dims);
        gpt2::block_forward_with(dev, cfg, l, &w, &buffers, input, output, n, attend, None);
    }

    /// The logits (V) of the last of `rows` rows of the last block's output x.
    pub fn logits<D: Backend<Tensor = T>>(&self, dev: &D, a: &Acts<T>, x: &T, rows: usize) -> Vec<f32> {
        let (c, v) = (self.cfg.n_embd, self.cfg.vocab_size);
        let head = gpt2::head_view(&self.cfg, &self.head);
        dev.layernorm_forward(&a.ln, &a.mean, &a.rstd, x, head.ln_f_weight, head.ln_f_bias, rows, c, self.cfg.layer_norm_epsilon as f32);
        // logits (1, V) = ln_f[last] (1, C) @ lm_head^T (C, V)
        let last = Operand { offset: (rows - 1) * c, row_stride: c, col_stride: 1 };
        let shape = MatmulShape { m: 1, n: v, k: c, a: last, b: Operand::transposed(c), c: Operand::row_major(v) };
        dev.matmul(&a.logits, &a.ln, head.lm_head, None, &shape, false);
        dev.read(&a.logits)
    }
}
