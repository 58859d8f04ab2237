// Shared by the SwiGLU kernels (prepended to their source).

// 1 / (1 + exp(-g)), through exp(g) for negative g so that exp's argument is never positive: no overflow,
// and no division by infinity (which WGSL leaves undefined), for any gate. Twin: sigmoid in ops/swiglu.rs.
fn sigmoid(g: f32) -> f32 {
    if (g >= 0.0) { return 1.0 / (1.0 + exp(-g)); }
    let e = exp(g);
    return e / (1.0 + e);
}

