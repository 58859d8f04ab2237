//! Llama (Touvron et al. 2023) as transformers' `LlamaForCausalLM` computes it: token embedding, L
//! pre-RMSNorm blocks (grouped-query attention with rotary position embeddings, then a SwiGLU MLP, each
//! added to the residual stream), a final RMSNorm, and logits through `lm_head` (or the embedding, when
//! tied).
//!
//! Shapes: B batch, T sequence, C hidden, F MLP width, V vocabulary, H query heads, KV key/value heads,
//! D head width. Weights keep Hugging Face's `nn.Linear` layout (out, in): a linear layer is
//! `y (BT, out) = x (BT, in) @ W^T`. q, k and v are written side by side into one (BT, (H + 2KV) D)
//! buffer [q | k | v], so one RoPE call rotates q and k together and attention reads K/V per kv head
//! without repeating them.

use anyhow::Result;

use super::TensorSpec;
use super::vocab::{LossActs, VocabChunks};
use crate::device::{AttentionDims, Backend, MatmulShape, Operand};
pub use zerostream_checkpoints::LlamaConfig;

mod block;
pub(crate) use block::linear_into;
pub use block::{ForwardBuffers, block_backward, block_forward, layer_forward_with};

crate::tensor_group! {
    /// The weights of one decoder layer, in Hugging Face's `nn.Linear` (out, in) layout.
    pub struct Block, config cfg: LlamaConfig {
        input_layernorm => "input_layernorm.weight", [cfg.hidden_size], no_decay;
        q_proj => "self_attn.q_proj.weight", [cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size], decay;
        k_proj => "self_attn.k_proj.weight", [cfg.num_key_value_heads * cfg.head_dim, cfg.hidden_size], decay;
        v_proj => "self_attn.v_proj.weight", [cfg.num_key_value_heads * cfg.head_dim, cfg.hidden_size], decay;
        o_proj => "self_attn.o_proj.weight", [cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim], decay;
        post_attention_layernorm => "post_attention_layernorm.weight", [cfg.hidden_size], no_decay;
        gate_proj => "mlp.gate_proj.weight", [cfg.intermediate_size, cfg.hidden_size], decay;
        up_proj => "mlp.up_proj.weight", [cfg.intermediate_size, cfg.hidden_size], decay;
        down_proj => "mlp.down_proj.weight", [cfg.hidden_size, cfg.intermediate_size], decay;
    }
}

crate::tensor_group! {
    /// The parameters outside the layers with an untied head.
    pub struct Head, config cfg: LlamaConfig {
        embed_tokens => "model.embed_tokens.weight", [cfg.vocab_size, cfg.hidden_size], decay;
        norm => "model.norm.weight", [cfg.hidden_size], no_decay;
        lm_head => "lm_head.weight", [cfg.vocab_size, cfg.hidden_size], decay;
    }
}

crate::tensor_group! {
    /// The parameters outside the layers when `lm_head` is the embedding (tie_word_embeddings).
    pub struct TiedHead, config cfg: LlamaConfig {
        embed_tokens => "model.embed_tokens.weight", [cfg.vocab_size, cfg.hidden_size], decay;
        norm => "model.norm.weight", [cfg.hidden_size], no_decay;
    }
}

crate::tensor_group! {
    /// Biases of q, k and v (Qwen2; Llama's `attention_bias`).
    pub struct QkvBias, config cfg: LlamaConfig {
        q => "self_attn.q_proj.bias", [cfg.num_attention_heads * cfg.head_dim], no_decay;
        k => "self_attn.k_proj.bias", [cfg.num_key_value_heads * cfg.head_dim], no_decay;
        v => "self_attn.v_proj.bias", [cfg.num_key_value_heads * cfg.head_dim], no_decay;
    }
}

crate::tensor_group! {
    /// The bias of o_proj (Llama's `attention_bias`).
    pub struct OBias, config cfg: LlamaConfig {
        o => "self_attn.o_proj.bias", [cfg.hidden_size], no_decay;
    }
}

crate::tensor_group! {
    /// The MLP's biases (Llama's `mlp_bias`).
    pub struct MlpBias, config cfg: LlamaConfig {
        gate => "mlp.gate_proj.bias", [cfg.intermediate_size], no_decay;
        up => "mlp.up_proj.bias", [cfg.intermediate_size], no_decay;
        down => "mlp.down_proj.bias", [cfg.hidden_size], no_decay;
    }
}

/// A layer's group: the weights' table, then the bias tables the config asks for, in this order.
pub fn block_specs(cfg: &LlamaConfig, l: usize) -> Vec<TensorSpec> {
    let prefix = block_prefix(l);
    let mut specs = Block::<()>::specs(cfg, &prefix);
    if cfg.qkv_bias || cfg.attention_bias {
        specs.extend(QkvBias::<()>::specs(cfg, &prefix));
    }
    if cfg.attention_bias {
        specs.extend(OBias::<()>::specs(cfg, &prefix));
    }
    if cfg.mlp_bias {
        specs.extend(MlpBias::<()>::specs(cfg, &prefix));
    }
    specs
}

/// A layer's tensors, given in [`block_specs`] order, by name.
pub struct Layer<'a, T> {
    pub w: Block<&'a T>,
    pub qkv_bias: Option<QkvBias<&'a T>>,
    pub o_bias: Option<OBias<&'a T>>,
    pub mlp_bias: Option<MlpBias<&'a T>>,
}

impl<'a, T> Layer<'a, T> {
    pub fn view(cfg: &LlamaConfig, t: &'a [T]) -> Self {
        let (weights, mut rest) = t.split_at(Block::<()>::specs(cfg, "").len());
        let mut take = |present: bool, n: usize| -> Option<&'a [T]> {
            present.then(|| {
                let (these, after) = rest.split_at(n);
                rest = after;
                these
            })
        };
        let qkv_bias = take(cfg.qkv_bias || cfg.attention_bias, 3).map(QkvBias::view);
        let o_bias = take(cfg.attention_bias, 1).map(OBias::view);
        let mlp_bias = take(cfg.mlp_bias, 3).map(MlpBias::view);
        assert!(rest.is_empty(), "a Llama layer: {} tensors given", t.len());
        Layer { w: Block::view(weights), qkv_bias, o_bias, mlp_bias }
    }
}

/// Layer l's Hugging Face name prefix.
pub fn block_prefix(l: usize) -> String {
    format!("model.layers.{l}.")
}

/// The head group's tensors in table order.
pub fn head_specs(cfg: &LlamaConfig) -> Vec<TensorSpec> {
    if cfg.tie_word_embeddings { TiedHead::<()>::specs(cfg, "") } else { Head::<()>::specs(cfg, "") }
}

/// (embed_tokens, norm, lm_head) of a head group given in table order: lm_head is the embedding when tied.
fn head_parts<'a, T>(cfg: &LlamaConfig, head: &'a [T]) -> (&'a T, &'a T, &'a T) {
    if cfg.tie_word_embeddings {
        let h = TiedHead::view(head);
        (h.embed_tokens, h.norm, h.embed_tokens)
    } else {
        let h = Head::view(head);
        (h.embed_tokens, h.norm, h.lm_head)
    }
}

/// Every parameter in Hugging Face's checkpoint order: embedding, layers, final norm, lm_head.
pub fn parameter_specs(cfg: &LlamaConfig) -> Vec<TensorSpec> {
    let head = head_specs(cfg);
    let mut specs = vec![head[0].clone()];
    for l in 0..cfg.num_hidden_layers {
        specs.extend(block_specs(cfg, l));
    }
    specs.extend_from_slice(&head[1..]);
    specs
}

/// What the engine implements of a Llama config (everything the config reader accepts).
pub fn check_supported(_cfg: &LlamaConfig) -> Result<()> {
    Ok(())
}

/// Llama's initialisation: N(0, 0.02) matrices (transformers' initializer_range), unit norm weights.
pub fn init_values(spec: &TensorSpec, index: usize, seed: u64) -> Vec<f32> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    if spec.shape.len() < 2 {
        return vec![1.0; spec.len()];
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index as u64);
    let normal = Normal::new(0.0f64, 0.02).expect("a valid normal distribution");
    (0..spec.len()).map(|_| normal.sample(&mut rng) as f32).collect()
}

pub fn attention_dims(cfg: &LlamaConfig, batch: usize, seq_len: usize) -> AttentionDims {
    AttentionDims::gqa(batch, seq_len, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
}

/// Widths of the packed [q | k | v] buffer: (q, one of k or v, all).
pub(crate) fn qkv_widths(cfg: &LlamaConfig) -> (usize, usize, usize) {
    let (q, kv) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
    (q, kv, q + 2 * kv)
}

/// What one layer keeps from forward for backward.
pub struct BlockActivations<T> {
    ln_1: T,       // (BT, C)
    ln_1_rstd: T,  // (BT)
    qkv: T,        // (BT, (H + 2KV) D), q and k rotated
    atty: T,       // (BT, H D) attention output before o_proj
    lse: T,        // (B, H, T)
    attn_proj: T,  // (BT, C)
    residual_2: T, // (BT, C) residual + attention
    ln_2: T,       // (BT, C)
    ln_2_rstd: T,  // (BT)
    gate_up: T,    // (BT, 2F) [gate | up]
    act: T,        // (BT, F) silu(gate) * up
    down: T,       // (BT, C)
    /// RoPE's inverse frequencies (D/2), the config's (Llama-3 scaling included).
    inv_freq: T,
}

impl<T> BlockActivations<T> {
    pub fn new<D: Backend<Tensor = T>>(dev: &D, cfg: &LlamaConfig, batch: usize, seq_len: usize) -> Result<Self> {
        let (bt, c, f) = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        let inv_freq = dev.alloc(cfg.head_dim / 2, "rope inv_freq")?;
        dev.write(&inv_freq, &cfg.inv_freq());
        Ok(BlockActivations {
            ln_1: dev.alloc(bt * c, "ln_1")?,
            ln_1_rstd: dev.alloc(bt, "ln_1 rstd")?,
            qkv: dev.alloc(bt * qkv_w, "qkv")?,
            atty: dev.alloc(bt * qw, "atty")?,
            lse: dev.alloc(batch * cfg.num_attention_heads * seq_len, "attention lse")?,
            attn_proj: dev.alloc(bt * c, "attn_proj")?,
            residual_2: dev.alloc(bt * c, "residual_2")?,
            ln_2: dev.alloc(bt * c, "ln_2")?,
            ln_2_rstd: dev.alloc(bt, "ln_2 rstd")?,
            gate_up: dev.alloc(bt * 2 * f, "gate_up")?,
            act: dev.alloc(bt * f, "swiglu")?,
            down: dev.alloc(bt * c, "down")?,
            inv_freq,
        })
    }

    /// Device bytes of one layer's activations, for budget planning.
    pub fn bytes(cfg: &LlamaConfig, batch: usize, seq_len: usize) -> u64 {
        let (bt, c, f) = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        let floats = bt * (6 * c + 2 + qkv_w + qw + 3 * f) + batch * cfg.num_attention_heads * seq_len + cfg.head_dim / 2;
        4 * floats as u64
    }
}

/// The activations outside the layers and the backward scratch, for one (B, T).
pub struct HeadActivations<T> {
    pub batch: usize,
    pub seq_len: usize,
    ln_f: T,      // (BT, C)
    ln_f_rstd: T, // (BT)
    pub loss: LossActs<T>,
    pub d_residual: T, // (BT, C)
    d_c: T,            // (BT, C)
    d_att: T,          // (BT, H D)
    d_act: T,          // (BT, F)
    d_gate_up: T,      // (BT, 2F)
    d_qkv: T,          // (BT, (H + 2KV) D)
    delta: T,          // (B, H, T)
    /// Zeros (T, C): Llama has no position embedding, and the embedding kernel adds one.
    no_positions: T,
    /// Where the embedding's backward puts the (unused) position gradient.
    d_no_positions: T,
    /// Ones (BT): a bias gradient is ones (1, BT) @ d(output window) when the output is a window.
    ones: T,
}

impl<T> HeadActivations<T> {
    /// `chunks` and `keep_logits` shape the loss's buffers ([`LossActs`]).
    pub fn new<D: Backend<Tensor = T>>(
        dev: &D,
        cfg: &LlamaConfig,
        batch: usize,
        seq_len: usize,
        chunks: VocabChunks,
        keep_logits: bool,
    ) -> Result<Self> {
        let (bt, c, f) = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        let no_positions = dev.alloc(seq_len * c, "no position embedding")?;
        dev.fill(&no_positions, 0.0);
        let ones = dev.alloc(bt, "ones")?;
        dev.fill(&ones, 1.0);
        Ok(HeadActivations {
            batch,
            seq_len,
            ln_f: dev.alloc(bt * c, "ln_f")?,
            ln_f_rstd: dev.alloc(bt, "ln_f rstd")?,
            loss: LossActs::new(dev, chunks, bt, keep_logits)?,
            d_residual: dev.alloc(bt * c, "d_residual")?,
            d_c: dev.alloc(bt * c, "d_c")?,
            d_att: dev.alloc(bt * qw, "d_att")?,
            d_act: dev.alloc(bt * f, "d_act")?,
            d_gate_up: dev.alloc(bt * 2 * f, "d_gate_up")?,
            d_qkv: dev.alloc(bt * qkv_w, "d_qkv")?,
            delta: dev.alloc(batch * cfg.num_attention_heads * seq_len, "attention delta")?,
            no_positions,
            d_no_positions: dev.alloc(seq_len * c, "d no positions")?,
            ones,
        })
    }

    /// Device bytes of [`HeadActivations::new`] besides the loss's buffers, for budget planning.
    pub fn bytes(cfg: &LlamaConfig, batch: usize, seq_len: usize) -> u64 {
        let (bt, c, f) = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size);
        let (qw, _, qkv_w) = qkv_widths(cfg);
        let floats = bt * (4 * c + 2 + qw + 3 * f + qkv_w) + batch * cfg.num_attention_heads * seq_len + 2 * seq_len * c;
        4 * floats as u64
    }

    /// The output of the final RMSNorm (Hugging Face's last hidden state).
    pub fn ln_f(&self) -> &T {
        &self.ln_f
    }
    pub fn logits(&self) -> &T {
        self.loss.logits().expect("a resident head keeps every chunk's logits")
    }
    /// d(ln_f): where the vocabulary projection's backward leaves the gradient of the final norm's output.
    pub fn ln_f_grad(&self) -> &T {
        &self.d_c
    }
}

/// x (B, T, C) = `embed_tokens[tokens]`: the input of layer 0.
pub fn embed_forward<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    x: &D::Tensor,
    head: &[D::Tensor],
    acts: &HeadActivations<D::Tensor>,
    inputs: &D::Tokens,
    seq_len: usize,
) {
    let (embed, _, _) = head_parts(cfg, head);
    dev.encoder_forward(x, inputs, embed, &acts.no_positions, seq_len, cfg.hidden_size);
}

/// [`embed_forward`] with the token rows embed_tokens[tokens] gathered by the caller into `rows` (BT, C)
/// and `positions` the ids 0..BT: x = rows (through the same kernel, adding zeros).
pub fn embed_rows_forward<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    x: &D::Tensor,
    rows: &D::Tensor,
    acts: &HeadActivations<D::Tensor>,
    positions: &D::Tokens,
    seq_len: usize,
) {
    dev.encoder_forward(x, positions, rows, &acts.no_positions, seq_len, cfg.hidden_size);
}

/// Backward of [`embed_rows_forward`]: d(rows) is the gradient of layer 0's input, `acts.d_residual`.
pub fn embed_rows_backward<T>(acts: &HeadActivations<T>) -> &T {
    &acts.d_residual
}

/// Backward of [`embed_forward`]: d(embed_tokens) += ... from `acts.d_residual`.
pub fn embed_backward<D: Backend>(dev: &D, cfg: &LlamaConfig, grads: &[D::Tensor], acts: &HeadActivations<D::Tensor>, inputs: &D::Tokens) {
    let (d_embed, _, _) = head_parts(cfg, grads);
    dev.encoder_backward(d_embed, &acts.d_no_positions, &acts.d_residual, inputs, acts.batch, acts.seq_len, cfg.hidden_size);
}

/// The final norm: ln_f (BT, C) = rmsnorm(x), the input of the vocabulary projection.
pub fn final_norm_forward<D: Backend>(dev: &D, cfg: &LlamaConfig, head: &[D::Tensor], acts: &HeadActivations<D::Tensor>, x: &D::Tensor) {
    let (bt, c) = (acts.batch * acts.seq_len, cfg.hidden_size);
    let (_, norm, _) = head_parts(cfg, head);
    dev.rmsnorm_forward(&acts.ln_f, &acts.ln_f_rstd, x, norm, bt, c, cfg.rms_norm_eps as f32);
}

/// Backward of [`final_norm_forward`] from d(ln_f) in `acts.d_c`: adds into the norm's gradient and
/// leaves d(x) in `acts.d_residual`.
pub fn final_norm_backward<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    head: &[D::Tensor],
    grads: &[D::Tensor],
    acts: &HeadActivations<D::Tensor>,
    x: &D::Tensor,
) {
    let (bt, c) = (acts.batch * acts.seq_len, cfg.hidden_size);
    let (_, norm, _) = head_parts(cfg, head);
    let (_, d_norm, _) = head_parts(cfg, grads);
    dev.fill(&acts.d_residual, 0.0);
    dev.rmsnorm_backward(&acts.d_residual, d_norm, &acts.d_c, x, norm, &acts.ln_f_rstd, bt, c);
}
