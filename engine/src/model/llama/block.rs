//! One Llama decoder layer, forward and backward: output = x + mlp(norm_2(x + attn(norm_1(x)))), with
//! RoPE on q and k, grouped-query attention and SwiGLU; and the shapes of its products over the packed
//! [q | k | v] and [gate | up] rows. The forward's sequence of kernels is shared with generation
//! (`model/decode/llama.rs`), which gives its own RoPE and attention over a KV cache and scratch
//! buffers ([`layer_forward_with`]).

use super::*;

/// y[:, col..col + n] (BT rows of `ld`) = x (BT, k) @ W^T, W (n, k) in `nn.Linear` layout.
pub(crate) fn linear_into(bt: usize, k: usize, n: usize, ld: usize, col: usize) -> MatmulShape {
    MatmulShape {
        m: bt,
        n,
        k,
        a: Operand::row_major(k),
        b: Operand::transposed(k),
        c: Operand { offset: col, row_stride: ld, col_stride: 1 },
    }
}

/// dx (BT, k) (+)= dy[:, col..col + n] @ W, W (n, k): the input gradient of [`linear_into`].
fn linear_dx(bt: usize, k: usize, n: usize, ld: usize, col: usize) -> MatmulShape {
    MatmulShape {
        m: bt,
        n: k,
        k: n,
        a: Operand { offset: col, row_stride: ld, col_stride: 1 },
        b: Operand::row_major(k),
        c: Operand::row_major(k),
    }
}

/// dW (n, k) += dy[:, col..col + n]^T @ x (BT, k): the weight gradient of [`linear_into`].
fn linear_dw(bt: usize, k: usize, n: usize, ld: usize, col: usize) -> MatmulShape {
    MatmulShape {
        m: n,
        n: k,
        k: bt,
        a: Operand { offset: col, row_stride: 1, col_stride: ld },
        b: Operand::row_major(k),
        c: Operand::row_major(k),
    }
}

/// dbias (n) += column sums of dy[:, col..col + n] (BT rows of `ld`), as ones (1, BT) @ that window.
fn bias_dw(bt: usize, n: usize, ld: usize, col: usize) -> MatmulShape {
    MatmulShape {
        m: 1,
        n,
        k: bt,
        a: Operand::row_major(bt),
        b: Operand { offset: col, row_stride: ld, col_stride: 1 },
        c: Operand::row_major(n),
    }
}

/// One decoder layer: output = x + mlp(norm_2(x + attn(norm_1(x)))), keeping what backward needs in `a`.
#[allow(clippy::too_many_arguments)]
pub fn block_forward<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    layer: &[D::Tensor],
    a: &BlockActivations<D::Tensor>,
    input: &D::Tensor,
    output: &D::Tensor,
    batch: usize,
    seq_len: usize,
) {
    let buffers = ForwardBuffers {
        ln_1: (&a.ln_1, &a.ln_1_rstd),
        qkv: &a.qkv,
        atty: &a.atty,
        attn_proj: &a.attn_proj,
        residual_2: &a.residual_2,
        ln_2: (&a.ln_2, &a.ln_2_rstd),
        gate_up: &a.gate_up,
        act: &a.act,
        down: &a.down,
    };
    let (bt, rotated_heads, (_, _, qkv_w)) = (batch * seq_len, cfg.num_attention_heads + cfg.num_key_value_heads, qkv_widths(cfg));
    let attend = |atty: &D::Tensor, qkv: &D::Tensor| {
        dev.rope(qkv, &a.inv_freq, seq_len, bt, qkv_w, 0, rotated_heads, cfg.head_dim, false);
        dev.attention_forward(atty, &a.lse, qkv, attention_dims(cfg, batch, seq_len));
    };
    layer_forward_with(dev, cfg, layer, &buffers, input, output, bt, attend);
}

/// Where one layer's forward writes: the training activations (kept for the backward), or the decoder's
/// scratch, which reuses one buffer for both norms and one for both projections. Norms as (out, rstd).
pub struct ForwardBuffers<'a, T> {
    pub ln_1: (&'a T, &'a T),
    pub qkv: &'a T,
    pub atty: &'a T,
    pub attn_proj: &'a T,
    pub residual_2: &'a T,
    pub ln_2: (&'a T, &'a T),
    pub gate_up: &'a T,
    pub act: &'a T,
    pub down: &'a T,
}

/// One layer on `rows` rows, into `b`: the one sequence of kernels training and decoding share, with
/// RoPE and the attention given (`attend(atty, qkv)`: over this sequence, or at absolute positions over
/// a KV cache).
#[allow(clippy::too_many_arguments)]
pub fn layer_forward_with<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    layer: &[D::Tensor],
    b: &ForwardBuffers<'_, D::Tensor>,
    input: &D::Tensor,
    output: &D::Tensor,
    rows: usize,
    attend: impl FnOnce(&D::Tensor, &D::Tensor),
) {
    let (c, f, eps) = (cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps as f32);
    let (qw, kvw, qkv_w) = qkv_widths(cfg);
    let Layer { w, qkv_bias, o_bias, mlp_bias } = Layer::view(cfg, layer);
    let (qb, kb, vb) = (qkv_bias.as_ref().map(|b| b.q), qkv_bias.as_ref().map(|b| b.k), qkv_bias.as_ref().map(|b| b.v));
    // x = x + o_proj(attention(rope(q), rope(k), v)), q, k, v from norm_1(x)
    dev.rmsnorm_forward(b.ln_1.0, b.ln_1.1, input, w.input_layernorm, rows, c, eps);
    for (weight, bias, col, width) in [(w.q_proj, qb, 0, qw), (w.k_proj, kb, qw, kvw), (w.v_proj, vb, qw + kvw, kvw)] {
        dev.matmul(b.qkv, b.ln_1.0, weight, bias, &linear_into(rows, c, width, qkv_w, col), false);
    }
    attend(b.atty, b.qkv);
    dev.matmul(b.attn_proj, b.atty, w.o_proj, o_bias.as_ref().map(|b| b.o), &linear_into(rows, qw, c, c, 0), false);
    dev.residual_forward(b.residual_2, input, b.attn_proj);
    // x = x + down(silu(gate(norm_2(x))) * up(norm_2(x)))
    dev.rmsnorm_forward(b.ln_2.0, b.ln_2.1, b.residual_2, w.post_attention_layernorm, rows, c, eps);
    let (gb, ub, db) = (mlp_bias.as_ref().map(|b| b.gate), mlp_bias.as_ref().map(|b| b.up), mlp_bias.as_ref().map(|b| b.down));
    dev.matmul(b.gate_up, b.ln_2.0, w.gate_proj, gb, &linear_into(rows, c, f, 2 * f, 0), false);
    dev.matmul(b.gate_up, b.ln_2.0, w.up_proj, ub, &linear_into(rows, c, f, 2 * f, f), false);
    dev.swiglu_forward(b.act, b.gate_up, rows, f);
    dev.matmul(b.down, b.act, w.down_proj, db, &linear_into(rows, f, c, c, 0), false);
    dev.residual_forward(output, b.residual_2, b.down);
}

/// Backward of [`block_forward`]: `h.d_residual` holds d(output) on entry and d(input) on return; the
/// layer's gradients are added into `g`.
#[allow(clippy::too_many_arguments)]
pub fn block_backward<D: Backend>(
    dev: &D,
    cfg: &LlamaConfig,
    layer: &[D::Tensor],
    grads: &[D::Tensor],
    a: &BlockActivations<D::Tensor>,
    input: &D::Tensor,
    h: &HeadActivations<D::Tensor>,
) {
    let (batch, seq_len) = (h.batch, h.seq_len);
    let (bt, c, f) = (batch * seq_len, cfg.hidden_size, cfg.intermediate_size);
    let (qw, kvw, qkv_w) = qkv_widths(cfg);
    let (w, g) = (Layer::view(cfg, layer).w, Layer::view(cfg, grads));
    let d_res = &h.d_residual;
    // The MLP: d_res holds d(output) = d(residual_2 + down), flowing to both unchanged.
    dev.matmul(&h.d_act, d_res, w.down_proj, None, &linear_dx(bt, f, c, c, 0), false);
    dev.matmul(g.w.down_proj, d_res, &a.act, None, &linear_dw(bt, f, c, c, 0), true);
    dev.swiglu_backward(&h.d_gate_up, &h.d_act, &a.gate_up, bt, f);
    if let Some(b) = &g.mlp_bias {
        dev.bias_backward(b.down, d_res, bt, c);
        dev.matmul(b.gate, &h.ones, &h.d_gate_up, None, &bias_dw(bt, f, 2 * f, 0), true);
        dev.matmul(b.up, &h.ones, &h.d_gate_up, None, &bias_dw(bt, f, 2 * f, f), true);
    }
    dev.matmul(&h.d_c, &h.d_gate_up, w.gate_proj, None, &linear_dx(bt, c, f, 2 * f, 0), false);
    dev.matmul(&h.d_c, &h.d_gate_up, w.up_proj, None, &linear_dx(bt, c, f, 2 * f, f), true);
    dev.matmul(g.w.gate_proj, &h.d_gate_up, &a.ln_2, None, &linear_dw(bt, c, f, 2 * f, 0), true);
    dev.matmul(g.w.up_proj, &h.d_gate_up, &a.ln_2, None, &linear_dw(bt, c, f, 2 * f, f), true);
    dev.rmsnorm_backward(d_res, g.w.post_attention_layernorm, &h.d_c, &a.residual_2, w.post_attention_layernorm, &a.ln_2_rstd, bt, c);
    // Attention: d_res now holds d(residual_2) = d(input + attn_proj).
    dev.matmul(&h.d_att, d_res, w.o_proj, None, &linear_dx(bt, qw, c, c, 0), false);
    dev.matmul(g.w.o_proj, d_res, &a.atty, None, &linear_dw(bt, qw, c, c, 0), true);
    if let Some(b) = &g.o_bias {
        dev.bias_backward(b.o, d_res, bt, c);
    }
    dev.attention_backward(&h.d_qkv, &h.delta, &h.d_att, &a.qkv, &a.atty, &a.lse, attention_dims(cfg, batch, seq_len));
    // RoPE is a rotation: its backward rotates the gradients of q and k back.
    let rotated_heads = cfg.num_attention_heads + cfg.num_key_value_heads;
    dev.rope(&h.d_qkv, &a.inv_freq, seq_len, bt, qkv_w, 0, rotated_heads, cfg.head_dim, true);
    let qkv_bias = g.qkv_bias.as_ref();
    let parts = [
        (w.q_proj, g.w.q_proj, qkv_bias.map(|b| b.q), 0, qw),
        (w.k_proj, g.w.k_proj, qkv_bias.map(|b| b.k), qw, kvw),
        (w.v_proj, g.w.v_proj, qkv_bias.map(|b| b.v), qw + kvw, kvw),
    ];
    for (i, (weight, grad, bias_grad, col, width)) in parts.into_iter().enumerate() {
        dev.matmul(&h.d_c, &h.d_qkv, weight, None, &linear_dx(bt, c, width, qkv_w, col), i > 0);
        dev.matmul(grad, &h.d_qkv, &a.ln_1, None, &linear_dw(bt, c, width, qkv_w, col), true);
        if let Some(db) = bias_grad {
            dev.matmul(db, &h.ones, &h.d_qkv, None, &bias_dw(bt, width, qkv_w, col), true);
        }
    }
    dev.rmsnorm_backward(d_res, g.w.input_layernorm, &h.d_c, input, w.input_layernorm, &a.ln_1_rstd, bt, c);
}
