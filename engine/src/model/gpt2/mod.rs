//! GPT-2 (Radford et al. 2019) as Hugging Face's `GPT2LMHeadModel` computes it: token + position
//! embedding, L pre-LayerNorm blocks (attention, then an MLP with the configured activation, each added
//! to the residual stream), a final LayerNorm, and logits through `lm_head`: the embedding matrix when
//! tied (`tie_word_embeddings`, the default), else a separate (V, C) tensor. Attention scores are scaled
//! by 1/sqrt(head size) unless `scale_attn_weights` is false, and by 1/(l + 1) more in block l with
//! `scale_attn_by_inverse_layer_idx`.
//!
//! Written once against [`Backend`], so the same code runs on the cpu and gpu devices. Shapes use
//! B batch, T sequence, C channels, V vocabulary, NH heads, and every weight keeps Hugging Face's
//! layout: Conv1D weights are (in, out), so a linear layer is `out (BT, N) = in (BT, K) @ W (K, N) + b`.

use anyhow::Result;

use super::TensorSpec;
use super::vocab::{self, LossActs, VocabChunks};
use crate::device::{Activation, AttentionDims, Backend, MatmulShape, Operand};
use crate::ops::dropout::{DropoutKeys, DropoutRates, DropoutSite};
pub use zerostream_checkpoints::Gpt2Config;

mod block;
mod resident;
pub use block::{ForwardBuffers, block_backward, block_forward, block_forward_with};
pub use resident::{Gpt2, Params};

crate::tensor_group! {
    /// The weights of one transformer block, in Hugging Face's layout (Conv1D weights are (in, out)).
    pub struct Block, config cfg: Gpt2Config {
        ln_1_weight => "ln_1.weight", [cfg.n_embd], no_decay;
        ln_1_bias => "ln_1.bias", [cfg.n_embd], no_decay;
        attn_weight => "attn.c_attn.weight", [cfg.n_embd, 3 * cfg.n_embd], decay;
        attn_bias => "attn.c_attn.bias", [3 * cfg.n_embd], no_decay;
        attn_proj_weight => "attn.c_proj.weight", [cfg.n_embd, cfg.n_embd], decay;
        attn_proj_bias => "attn.c_proj.bias", [cfg.n_embd], no_decay;
        ln_2_weight => "ln_2.weight", [cfg.n_embd], no_decay;
        ln_2_bias => "ln_2.bias", [cfg.n_embd], no_decay;
        fc_weight => "mlp.c_fc.weight", [cfg.n_embd, cfg.hidden()], decay;
        fc_bias => "mlp.c_fc.bias", [cfg.hidden()], no_decay;
        fc_proj_weight => "mlp.c_proj.weight", [cfg.hidden(), cfg.n_embd], decay;
        fc_proj_bias => "mlp.c_proj.bias", [cfg.n_embd], no_decay;
    }
}

crate::tensor_group! {
    /// The parameters outside the blocks with an untied head: the embeddings, the final layer norm and
    /// the output layer.
    pub struct Head, config cfg: Gpt2Config {
        wte => "transformer.wte.weight", [cfg.vocab_size, cfg.n_embd], decay;
        wpe => "transformer.wpe.weight", [cfg.n_positions, cfg.n_embd], decay;
        ln_f_weight => "transformer.ln_f.weight", [cfg.n_embd], no_decay;
        ln_f_bias => "transformer.ln_f.bias", [cfg.n_embd], no_decay;
        lm_head => "lm_head.weight", [cfg.vocab_size, cfg.n_embd], decay;
    }
}

crate::tensor_group! {
    /// The parameters outside the blocks when wte doubles as the lm_head (tie_word_embeddings).
    pub struct TiedHead, config cfg: Gpt2Config {
        wte => "transformer.wte.weight", [cfg.vocab_size, cfg.n_embd], decay;
        wpe => "transformer.wpe.weight", [cfg.n_positions, cfg.n_embd], decay;
        ln_f_weight => "transformer.ln_f.weight", [cfg.n_embd], no_decay;
        ln_f_bias => "transformer.ln_f.bias", [cfg.n_embd], no_decay;
    }
}

/// The head group's tensors in table order.
pub fn head_specs(cfg: &Gpt2Config) -> Vec<TensorSpec> {
    if cfg.tie_word_embeddings { TiedHead::<()>::specs(cfg, "") } else { Head::<()>::specs(cfg, "") }
}

/// The head group given in table order, as a [`Head`] whose `lm_head` is wte when tied: the head
/// functions read (and, given gradients, add into) `lm_head` either way, so a tied model's output layer
/// gradient lands in wte's.
pub fn head_view<'a, T>(cfg: &Gpt2Config, head: &'a [T]) -> Head<&'a T> {
    if cfg.tie_word_embeddings {
        let h = TiedHead::view(head);
        Head { wte: h.wte, wpe: h.wpe, ln_f_weight: h.ln_f_weight, ln_f_bias: h.ln_f_bias, lm_head: h.wte }
    } else {
        Head::view(head)
    }
}

/// Block l's Hugging Face name prefix.
pub fn block_prefix(l: usize) -> String {
    format!("transformer.h.{l}.")
}

/// Every parameter in Hugging Face's checkpoint order: wte, wpe, the blocks, ln_f, and lm_head if untied.
pub fn parameter_specs(cfg: &Gpt2Config) -> Vec<TensorSpec> {
    let head = head_specs(cfg);
    let mut specs = head[..2].to_vec();
    for l in 0..cfg.n_layer {
        specs.extend(Block::<()>::specs(cfg, &block_prefix(l)));
    }
    specs.extend_from_slice(&head[2..]);
    specs
}

/// GPT-2's initialisation of tensor `spec` (number `index` in checkpoint order), seeded: N(0, 0.02)
/// weights (c_proj weights scaled by 1/sqrt(2L)), zero biases, unit layer-norm gains. Each tensor has
/// its own stream, so its values do not depend on the other tensors' sizes.
pub fn init_values(cfg: &Gpt2Config, spec: &TensorSpec, index: usize, seed: u64) -> Vec<f32> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    let (name, n) = (spec.name.as_str(), spec.len());
    if name.ends_with(".bias") {
        return vec![0.0; n];
    }
    if name.contains(".ln_") {
        return vec![1.0; n];
    }
    let std = if name.ends_with("c_proj.weight") { 0.02 / (2.0 * cfg.n_layer as f64).sqrt() } else { 0.02 };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64);
    let normal = Normal::new(0.0f64, std).expect("a valid normal distribution");
    (0..n).map(|_| normal.sample(&mut rng) as f32).collect()
}

/// What one block keeps from forward for backward.
pub struct BlockActivations<T> {
    ln_1: T,       // (BT, C)
    ln_1_mean: T,  // (BT)
    ln_1_rstd: T,  // (BT)
    qkv: T,        // (BT, 3C)
    atty: T,       // (BT, C) attention output before its projection
    lse: T,        // (B, NH, T)
    attn_proj: T,  // (BT, C)
    residual_2: T, // (BT, C) residual + attention
    ln_2: T,       // (BT, C)
    ln_2_mean: T,  // (BT)
    ln_2_rstd: T,  // (BT)
    fc: T,         // (BT, 4C)
    fc_gelu: T,    // (BT, 4C)
    fc_proj: T,    // (BT, C)
}

impl<T> BlockActivations<T> {
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &Gpt2Config, batch: usize, seq_len: usize) -> Result<Self> {
        let (bt, c, h) = (batch * seq_len, cfg.n_embd, cfg.hidden());
        let stat = batch * cfg.n_head * seq_len;
        Ok(BlockActivations {
            ln_1: dev.alloc(bt * c, "ln_1")?,
            ln_1_mean: dev.alloc(bt, "ln_1 mean")?,
            ln_1_rstd: dev.alloc(bt, "ln_1 rstd")?,
            qkv: dev.alloc(bt * 3 * c, "qkv")?,
            atty: dev.alloc(bt * c, "atty")?,
            lse: dev.alloc(stat, "attention lse")?,
            attn_proj: dev.alloc(bt * c, "attn_proj")?,
            residual_2: dev.alloc(bt * c, "residual_2")?,
            ln_2: dev.alloc(bt * c, "ln_2")?,
            ln_2_mean: dev.alloc(bt, "ln_2 mean")?,
            ln_2_rstd: dev.alloc(bt, "ln_2 rstd")?,
            fc: dev.alloc(bt * h, "fc")?,
            fc_gelu: dev.alloc(bt * h, "fc_gelu")?,
            fc_proj: dev.alloc(bt * c, "fc_proj")?,
        })
    }

    /// Device bytes of one block's activations, for budget planning.
    pub fn bytes(cfg: &Gpt2Config, batch: usize, seq_len: usize) -> u64 {
        let (bt, c, h) = (batch * seq_len, cfg.n_embd, cfg.hidden());
        let floats = bt * (9 * c + 4) + 2 * bt * h + batch * cfg.n_head * seq_len;
        4 * floats as u64
    }
}

/// The activations outside the blocks (final layer norm, the loss's buffers) and the backward scratch
/// buffers, for one (B, T). `d_residual` carries the gradient of the residual stream between blocks.
pub struct HeadActivations<T> {
    pub batch: usize,
    pub seq_len: usize,
    ln_f: T,      // (BT, C)
    ln_f_mean: T, // (BT)
    ln_f_rstd: T, // (BT)
    pub loss: LossActs<T>,
    pub d_residual: T, // (BT, C)
    d_c: T,            // (BT, C) d(ln_f) between the vocabulary projection's backward and ln_f's
    d_hidden_a: T,     // (BT, 4C)
    d_hidden_b: T,     // (BT, 4C)
    d_qkv: T,          // (BT, 3C)
    delta: T,          // (B, NH, T)
}

impl<T> HeadActivations<T> {
    /// `chunks` and `keep_logits` shape the loss's buffers ([`LossActs`]).
    pub fn new<D: Backend<Tensor = T>>(
        dev: &D,
        cfg: &Gpt2Config,
        batch: usize,
        seq_len: usize,
        chunks: VocabChunks,
        keep_logits: bool,
    ) -> Result<Self> {
        let (bt, c, h) = (batch * seq_len, cfg.n_embd, cfg.hidden());
        let stat = batch * cfg.n_head * seq_len;
        Ok(HeadActivations {
            batch,
            seq_len,
            ln_f: dev.alloc(bt * c, "ln_f")?,
            ln_f_mean: dev.alloc(bt, "ln_f mean")?,
            ln_f_rstd: dev.alloc(bt, "ln_f rstd")?,
            loss: LossActs::new(dev, chunks, bt, keep_logits)?,
            d_residual: dev.alloc(bt * c, "d_residual")?,
            d_c: dev.alloc(bt * c, "d_c")?,
            d_hidden_a: dev.alloc(bt * h, "d_hidden_a")?,
            d_hidden_b: dev.alloc(bt * h, "d_hidden_b")?,
            d_qkv: dev.alloc(bt * 3 * c, "d_qkv")?,
            delta: dev.alloc(stat, "attention delta")?,
        })
    }

    /// Device bytes of [`HeadActivations::new`] besides the loss's buffers, for budget planning.
    pub fn bytes(cfg: &Gpt2Config, batch: usize, seq_len: usize) -> u64 {
        let (bt, c, h) = (batch * seq_len, cfg.n_embd, cfg.hidden());
        let floats = bt * (6 * c + 2 + 2 * h) + batch * cfg.n_head * seq_len;
        4 * floats as u64
    }

    /// The logits of the last forward (or their gradient, if it had a gradient scale).
    pub fn logits(&self) -> &T {
        self.loss.logits().expect("a resident head keeps every chunk's logits")
    }
    /// d(ln_f): where the vocabulary projection's backward leaves the gradient of the final norm's output.
    pub fn ln_f_grad(&self) -> &T {
        &self.d_c
    }
    pub fn ln_f(&self) -> &T {
        &self.ln_f
    }
}

/// The shape of every block's attention, with the scale of block 0.
pub fn attention_dims(cfg: &Gpt2Config, batch: usize, seq_len: usize) -> AttentionDims {
    block_attention_dims(cfg, batch, seq_len, 0)
}

/// Block l's attention, scaled as transformers' `GPT2Attention` does: by 1/sqrt(head size) if
/// `scale_attn_weights`, and by 1/(l + 1) more if `scale_attn_by_inverse_layer_idx`.
pub fn block_attention_dims(cfg: &Gpt2Config, batch: usize, seq_len: usize, l: usize) -> AttentionDims {
    let d = AttentionDims::mha(batch, seq_len, cfg.n_embd, cfg.n_head);
    let mut scale = if cfg.scale_attn_weights { d.scale } else { 1.0 };
    if cfg.scale_attn_by_inverse_layer_idx {
        scale /= (l + 1) as f32;
    }
    d.with_scale(scale)
}

/// The MLP's activation (`validate` has refused any other name).
pub fn activation(cfg: &Gpt2Config) -> Activation {
    Activation::from_hf_name(&cfg.activation_function)
        .unwrap_or_else(|| panic!("activation_function {:?}: the config was not validated", cfg.activation_function))
}

/// The config's dropout probabilities (`embd_pdrop`, `attn_pdrop`, `resid_pdrop`).
pub fn dropout_rates(cfg: &Gpt2Config) -> DropoutRates {
    DropoutRates { embd: cfg.embd_pdrop, attn: cfg.attn_pdrop, resid: cfg.resid_pdrop }
}

/// x (B, T, C) = `dropout(wte[tokens] + wpe[0..T])`: the input of block 0. With embedding dropout the
/// sum goes through `acts.d_c`, free during forward.
#[allow(clippy::too_many_arguments)]
pub fn embed_forward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    x: &D::Tensor,
    head: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    inputs: &D::Tokens,
    seq_len: usize,
    dropout: Option<&DropoutKeys>,
) {
    embed_from(dev, cfg, x, head.wte, inputs, head.wpe, acts, seq_len, dropout);
}

/// [`embed_forward`] with the token rows wte[tokens] gathered by the caller into `rows` (BT, C) and
/// `positions` the ids 0..BT (row i of `rows` is token i): the same sums, without wte on the device.
#[allow(clippy::too_many_arguments)]
pub fn embed_rows_forward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    x: &D::Tensor,
    rows: &D::Tensor,
    head: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    positions: &D::Tokens,
    seq_len: usize,
    dropout: Option<&DropoutKeys>,
) {
    embed_from(dev, cfg, x, rows, positions, head.wpe, acts, seq_len, dropout);
}

/// x = dropout(table[ids] + wpe[0..T]).
#[allow(clippy::too_many_arguments)]
fn embed_from<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    x: &D::Tensor,
    table: &D::Tensor,
    ids: &D::Tokens,
    wpe: &D::Tensor,
    acts: &HeadActivations<D::Tensor>,
    seq_len: usize,
    dropout: Option<&DropoutKeys>,
) {
    match dropout.and_then(|d| d.mask(0, DropoutSite::Embedding)) {
        None => dev.encoder_forward(x, ids, table, wpe, seq_len, cfg.n_embd),
        Some(mask) => {
            dev.encoder_forward(&acts.d_c, ids, table, wpe, seq_len, cfg.n_embd);
            dev.dropout(x, &acts.d_c, cfg.n_embd, &mask);
        }
    }
}

/// The gradient of the embedding's sum (BT, C): `acts.d_residual`, the gradient of block 0's input,
/// masked into `acts.d_c` under embedding dropout.
fn embedding_grad<'t, D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    acts: &'t HeadActivations<D::Tensor>,
    dropout: Option<&DropoutKeys>,
) -> &'t D::Tensor {
    match dropout.and_then(|d| d.mask(0, DropoutSite::Embedding)) {
        None => &acts.d_residual,
        Some(mask) => {
            dev.dropout(&acts.d_c, &acts.d_residual, cfg.n_embd, &mask);
            &acts.d_c
        }
    }
}

/// Backward of [`embed_forward`]: dwte, dwpe += ... from `acts.d_residual`.
pub fn embed_backward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    grads: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    inputs: &D::Tokens,
    dropout: Option<&DropoutKeys>,
) {
    let d_embedding = embedding_grad(dev, cfg, acts, dropout);
    dev.encoder_backward(grads.wte, grads.wpe, d_embedding, inputs, acts.batch, acts.seq_len, cfg.n_embd);
}

/// Backward of [`embed_rows_forward`]: dwpe += ...; returns the tensor holding d(rows) (BT, C), which
/// the caller adds into the token rows of wte's gradient.
pub fn embed_rows_backward<'t, D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    grads: &Head<&D::Tensor>,
    acts: &'t HeadActivations<D::Tensor>,
    positions: &D::Tokens,
    dropout: Option<&DropoutKeys>,
) -> &'t D::Tensor {
    let d_embedding = embedding_grad(dev, cfg, acts, dropout);
    // The kernel also adds d(rows) into a token-row gradient; with ids 0..BT that is a copy, made into
    // scratch that is free here and read by no one.
    dev.encoder_backward(&acts.d_hidden_a, grads.wpe, d_embedding, positions, acts.batch, acts.seq_len, cfg.n_embd);
    d_embedding
}

/// ln_f (BT, C) = layernorm(x), the input of the vocabulary projection.
pub fn final_norm_forward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    head: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    x: &D::Tensor,
) {
    let (bt, c) = (acts.batch * acts.seq_len, cfg.n_embd);
    let eps = cfg.layer_norm_epsilon as f32;
    dev.layernorm_forward(&acts.ln_f, &acts.ln_f_mean, &acts.ln_f_rstd, x, head.ln_f_weight, head.ln_f_bias, bt, c, eps);
}

/// Backward of [`final_norm_forward`] from d(ln_f) in `acts.d_c`: adds into the ln_f gradients and
/// leaves d(x) in `acts.d_residual`.
pub fn final_norm_backward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    head: &Head<&D::Tensor>,
    grads: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    x: &D::Tensor,
) {
    let (bt, c) = (acts.batch * acts.seq_len, cfg.n_embd);
    dev.fill(&acts.d_residual, 0.0);
    dev.layernorm_backward(
        &acts.d_residual,
        grads.ln_f_weight,
        grads.ln_f_bias,
        &acts.d_c,
        x,
        head.ln_f_weight,
        &acts.ln_f_mean,
        &acts.ln_f_rstd,
        bt,
        c,
    );
}

/// ln_f, the lm_head (transposed) and the cross-entropy of the last block's output `x`, in vocabulary
/// chunks ([`vocab`]); returns the mean loss. With `loss_grad_scale = Some(s)` the gradient of
/// `s * mean loss` is left in the logits.
pub fn head_forward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    head: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    x: &D::Tensor,
    targets: &D::Tokens,
    loss_grad_scale: Option<f32>,
) -> f32 {
    final_norm_forward(dev, cfg, head, acts, x);
    vocab::resident_forward(dev, &acts.loss, &acts.ln_f, head.lm_head, targets, cfg.n_embd, loss_grad_scale)
}

/// Backward of [`head_forward`] (which must have had a gradient scale): adds into the lm_head (wte when
/// tied) and ln_f gradients and leaves d(x) in `acts.d_residual`.
pub fn head_backward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    head: &Head<&D::Tensor>,
    grads: &Head<&D::Tensor>,
    acts: &HeadActivations<D::Tensor>,
    x: &D::Tensor,
) {
    vocab::resident_backward(dev, &acts.loss, &acts.ln_f, &acts.d_c, head.lm_head, grads.lm_head, cfg.n_embd);
    final_norm_backward(dev, cfg, head, grads, acts, x);
}
