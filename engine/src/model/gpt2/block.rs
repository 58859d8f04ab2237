//! One GPT-2 block, forward and backward: output = x + mlp(ln_2(x + attn(ln_1(x)))), with dropout on
//! the attention probabilities and both branches' outputs in training. The forward's sequence of
//! kernels is shared with generation (`model/decode/gpt2.rs`), which gives its own attention over a KV
//! cache and scratch buffers ([`block_forward_with`]).

use super::*;

/// out (BT, N) = inp (BT, K) @ weight (K, N) + bias: a Hugging Face Conv1D.
#[allow(clippy::too_many_arguments)]
fn linear_forward<D: Backend>(
    dev: &D,
    out: &D::Tensor,
    inp: &D::Tensor,
    weight: &D::Tensor,
    bias: &D::Tensor,
    bt: usize,
    k: usize,
    n: usize,
) {
    dev.matmul(out, inp, weight, Some(bias), &MatmulShape::row_major(bt, n, k), false);
}

/// Backward of [`linear_forward`]: dinp = dout @ W^T (overwritten), dW += inp^T @ dout, db += colsum(dout).
#[allow(clippy::too_many_arguments)]
fn linear_backward<D: Backend>(
    dev: &D,
    dinp: &D::Tensor,
    dweight: &D::Tensor,
    dbias: &D::Tensor,
    dout: &D::Tensor,
    inp: &D::Tensor,
    weight: &D::Tensor,
    bt: usize,
    k: usize,
    n: usize,
) {
    // dinp (BT, K) = dout (BT, N) @ W^T (N, K)
    let dinp_shape = MatmulShape { m: bt, n: k, k: n, a: Operand::row_major(n), b: Operand::transposed(n), c: Operand::row_major(k) };
    dev.matmul(dinp, dout, weight, None, &dinp_shape, false);
    // dW (K, N) += inp^T (K, BT) @ dout (BT, N)
    let dw_shape = MatmulShape { m: k, n, k: bt, a: Operand::transposed(k), b: Operand::row_major(n), c: Operand::row_major(n) };
    dev.matmul(dweight, inp, dout, None, &dw_shape, true);
    dev.bias_backward(dbias, dout, bt, n);
}

/// residual + dropout(x) into `out`: the residual connection of `site` in block l.
#[allow(clippy::too_many_arguments)]
fn residual_add<D: Backend>(
    dev: &D,
    out: &D::Tensor,
    residual: &D::Tensor,
    x: &D::Tensor,
    channels: usize,
    dropout: Option<&DropoutKeys>,
    l: usize,
    site: DropoutSite,
) {
    match dropout.and_then(|d| d.mask(l, site)) {
        None => dev.residual_forward(out, residual, x),
        Some(mask) => dev.dropout_residual(out, residual, x, channels, &mask),
    }
}

/// The gradient of a residual branch's output from `d_out`, the gradient of the sum: `d_out` itself,
/// or under dropout its masked copy in `scratch` (at least (BT, C)).
#[allow(clippy::too_many_arguments)]
fn residual_branch_grad<'t, D: Backend>(
    dev: &D,
    d_out: &'t D::Tensor,
    scratch: &'t D::Tensor,
    channels: usize,
    dropout: Option<&DropoutKeys>,
    l: usize,
    site: DropoutSite,
) -> &'t D::Tensor {
    match dropout.and_then(|d| d.mask(l, site)) {
        None => d_out,
        Some(mask) => {
            dev.dropout(scratch, d_out, channels, &mask);
            scratch
        }
    }
}

/// Block l's attention under this micro-batch's dropout.
fn block_attention(cfg: &Gpt2Config, batch: usize, seq_len: usize, l: usize, dropout: Option<&DropoutKeys>) -> AttentionDims {
    block_attention_dims(cfg, batch, seq_len, l).with_dropout(dropout.and_then(|d| d.mask(l, DropoutSite::AttentionProbs)))
}

/// Block l: output = x + mlp(ln_2(x + attn(ln_1(x)))), keeping what backward needs in `a`. Under
/// `dropout` the attention probabilities and both branches' outputs (before their residual adds) are
/// masked, as transformers' `GPT2Block` does in training.
#[allow(clippy::too_many_arguments)]
pub fn block_forward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    l: usize,
    w: &Block<&D::Tensor>,
    a: &BlockActivations<D::Tensor>,
    input: &D::Tensor,
    output: &D::Tensor,
    batch: usize,
    seq_len: usize,
    dropout: Option<&DropoutKeys>,
) {
    let buffers = ForwardBuffers {
        ln_1: (&a.ln_1, &a.ln_1_mean, &a.ln_1_rstd),
        qkv: &a.qkv,
        atty: &a.atty,
        attn_proj: &a.attn_proj,
        residual_2: &a.residual_2,
        ln_2: (&a.ln_2, &a.ln_2_mean, &a.ln_2_rstd),
        fc: &a.fc,
        fc_act: &a.fc_gelu,
        fc_proj: &a.fc_proj,
    };
    let attend =
        |atty: &D::Tensor, qkv: &D::Tensor| dev.attention_forward(atty, &a.lse, qkv, block_attention(cfg, batch, seq_len, l, dropout));
    block_forward_with(dev, cfg, l, w, &buffers, input, output, batch * seq_len, attend, dropout);
}

/// Where one block's forward writes: the training activations (kept for the backward), or the decoder's
/// scratch, which reuses one buffer for both layer norms and one for both projections. Layer norms as
/// (out, mean, rstd).
pub struct ForwardBuffers<'a, T> {
    pub ln_1: (&'a T, &'a T, &'a T),
    pub qkv: &'a T,
    pub atty: &'a T,
    pub attn_proj: &'a T,
    pub residual_2: &'a T,
    pub ln_2: (&'a T, &'a T, &'a T),
    pub fc: &'a T,
    pub fc_act: &'a T,
    pub fc_proj: &'a T,
}

/// Block l on `rows` rows, into `b`: the one sequence of kernels training and decoding share, with the
/// attention itself given (`attend(atty, qkv)`: over this sequence, or over a KV cache).
#[allow(clippy::too_many_arguments)]
pub fn block_forward_with<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    l: usize,
    w: &Block<&D::Tensor>,
    b: &ForwardBuffers<'_, D::Tensor>,
    input: &D::Tensor,
    output: &D::Tensor,
    rows: usize,
    attend: impl FnOnce(&D::Tensor, &D::Tensor),
    dropout: Option<&DropoutKeys>,
) {
    let (c, h) = (cfg.n_embd, cfg.hidden());
    let eps = cfg.layer_norm_epsilon as f32;
    // x = x + attn(ln_1(x))
    dev.layernorm_forward(b.ln_1.0, b.ln_1.1, b.ln_1.2, input, w.ln_1_weight, w.ln_1_bias, rows, c, eps);
    linear_forward(dev, b.qkv, b.ln_1.0, w.attn_weight, w.attn_bias, rows, c, 3 * c);
    attend(b.atty, b.qkv);
    linear_forward(dev, b.attn_proj, b.atty, w.attn_proj_weight, w.attn_proj_bias, rows, c, c);
    residual_add(dev, b.residual_2, input, b.attn_proj, c, dropout, l, DropoutSite::AttentionOutput);
    // x = x + mlp(ln_2(x))
    dev.layernorm_forward(b.ln_2.0, b.ln_2.1, b.ln_2.2, b.residual_2, w.ln_2_weight, w.ln_2_bias, rows, c, eps);
    linear_forward(dev, b.fc, b.ln_2.0, w.fc_weight, w.fc_bias, rows, c, h);
    dev.activation_forward(activation(cfg), b.fc_act, b.fc);
    linear_forward(dev, b.fc_proj, b.fc_act, w.fc_proj_weight, w.fc_proj_bias, rows, h, c);
    residual_add(dev, output, b.residual_2, b.fc_proj, c, dropout, l, DropoutSite::MlpOutput);
}

/// Backward of [`block_forward`]: `head.d_residual` holds d(output) on entry and d(input) on return;
/// the block's parameter gradients are added into `g`.
#[allow(clippy::too_many_arguments)]
pub fn block_backward<D: Backend>(
    dev: &D,
    cfg: &Gpt2Config,
    l: usize,
    w: &Block<&D::Tensor>,
    g: &Block<&D::Tensor>,
    a: &BlockActivations<D::Tensor>,
    input: &D::Tensor,
    head: &HeadActivations<D::Tensor>,
    dropout: Option<&DropoutKeys>,
) {
    let (batch, seq_len) = (head.batch, head.seq_len);
    let (bt, c, h) = (batch * seq_len, cfg.n_embd, cfg.hidden());
    let d_res = &head.d_residual;
    // d_res holds d(output) = d(residual_2 + dropout(fc_proj)): it flows to residual_2 unchanged, and
    // to fc_proj through the mask (into d_c, free until the fc backward).
    let d_fc_proj = residual_branch_grad(dev, d_res, &head.d_c, c, dropout, l, DropoutSite::MlpOutput);
    linear_backward(dev, &head.d_hidden_a, g.fc_proj_weight, g.fc_proj_bias, d_fc_proj, &a.fc_gelu, w.fc_proj_weight, bt, h, c);
    dev.fill(&head.d_hidden_b, 0.0);
    dev.activation_backward(activation(cfg), &head.d_hidden_b, &a.fc, &head.d_hidden_a);
    linear_backward(dev, &head.d_c, g.fc_weight, g.fc_bias, &head.d_hidden_b, &a.ln_2, w.fc_weight, bt, c, h);
    dev.layernorm_backward(d_res, g.ln_2_weight, g.ln_2_bias, &head.d_c, &a.residual_2, w.ln_2_weight, &a.ln_2_mean, &a.ln_2_rstd, bt, c);
    // d_res now holds d(residual_2) = d(input + dropout(attn_proj)); the masked copy goes in d_qkv,
    // free until attention_backward.
    let d_attn_proj = residual_branch_grad(dev, d_res, &head.d_qkv, c, dropout, l, DropoutSite::AttentionOutput);
    linear_backward(dev, &head.d_c, g.attn_proj_weight, g.attn_proj_bias, d_attn_proj, &a.atty, w.attn_proj_weight, bt, c, c);
    let attention = block_attention(cfg, batch, seq_len, l, dropout);
    dev.attention_backward(&head.d_qkv, &head.delta, &head.d_c, &a.qkv, &a.atty, &a.lse, attention);
    // d_c is free again once attention_backward has consumed it.
    linear_backward(dev, &head.d_c, g.attn_weight, g.attn_bias, &head.d_qkv, &a.ln_1, w.attn_weight, bt, c, 3 * c);
    dev.layernorm_backward(d_res, g.ln_1_weight, g.ln_1_bias, &head.d_c, input, w.ln_1_weight, &a.ln_1_mean, &a.ln_1_rstd, bt, c);
}
