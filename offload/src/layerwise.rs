//! LAMB and LARS: the layer-wise adaptive optimizers for large batches, over one shard of fp32 master
//! parameters. Each scales a tensor's step by a trust ratio made of that tensor's norms, so one
//! tensor's step takes two passes with the norms summed between them (across ranks, when the tensor
//! is split between them):
//!
//! 1. [`Layerwise::measure`]: this slice's squared norms (LAMB also updates its moments here);
//! 2. [`Layerwise::trust_ratio`] of the whole tensor's norms (the slices' put together by
//!    [`NormSlots`]), then [`Layerwise::apply`] steps the slice.
//!
//! LAMB, after You et al. 2020 ("Large Batch Optimization for Deep Learning: Training BERT in 76
//! Minutes", Algorithm 2, with its bias correction and φ the identity):
//!
//! ```text
//! g = grad * grad_scale
//! m = m + (1 - beta1) * (g - m)            v = beta2 * v + (1 - beta2) * g * g
//! u = (m / (1 - beta1^t)) / (sqrt(v) / sqrt(1 - beta2^t) + eps) + wd * p
//! trust = |p| / |u|                        (1 if either norm is 0)
//! p = p - (lr * trust) * u
//! ```
//!
//! LARS, after You, Gitman and Ginsburg 2017 ("Large Batch Training of Convolutional Networks",
//! Algorithm 1's local learning rate), with the momentum of `torch.optim.SGD` (no dampening, the global
//! learning rate outside the buffer, as PyTorch's LARS implementations do):
//!
//! ```text
//! g = grad * grad_scale
//! trust = eta * |p| / (|g| + wd * |p|)     (1 if |p| or |g| is 0)
//! d = (g + wd * p) * trust
//! buf = momentum * buf + d
//! p = p - lr * buf
//! ```
//!
//! As in the authors' BERT code, tensors excluded from weight decay (biases, norms' gains) are also
//! excluded from the adaptation: their trust ratio is 1 (LAMB is then Adam, LARS plain momentum SGD).
//!
//! Norms are sums of squares in f64 in pieces of [`NORM_PIECE_ELEMS`] (each in eight interleaved
//! lanes), blocks of [`NORM_BLOCK_ELEMS`] and the tensor, each at fixed places of the group and added
//! in order (`layerwise/norms.rs`): the same bits for any thread count, and for any world size however
//! the ranks' slices cut the tensor. No multiply-add is ever contracted, so every CPU and instruction
//! set gives the same bits too.

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::adam::rounding::bf16_from_f32;
use crate::adam::{Isa, ParamCopy};

mod norms;
pub use norms::{NORM_BLOCK_ELEMS, NORM_PIECE_ELEMS, NormSlots, PartNorms};

/// Which rule, with its own hyper-parameters. f64, as Python hands them to PyTorch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    Lamb { beta1: f64, beta2: f64, eps: f64 },
    Lars { momentum: f64, trust_coefficient: f64 },
}

/// A layer-wise optimizer's hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerwiseConfig {
    pub lr: f64,
    pub weight_decay: f64,
    pub rule: Rule,
    /// LAMB's second moment frozen past this step, as `AdamConfig::variance_frozen_after` (LARS
    /// keeps no variance: must be None).
    pub variance_frozen_after: Option<u64>,
}

impl LayerwiseConfig {
    /// Moments per parameter the rule keeps: LAMB two (m, v), LARS one (the momentum buffer).
    pub fn moments(&self) -> usize {
        match self.rule {
            Rule::Lamb { .. } => 2,
            Rule::Lars { .. } => 1,
        }
    }
}

/// A slice's (or, summed, a tensor's) squared norms: of the parameters and of what the trust ratio
/// divides by (LAMB's update u, LARS's gradient g).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SquaredNorms {
    pub param: f64,
    pub update: f64,
}

impl std::ops::Add for SquaredNorms {
    type Output = SquaredNorms;
    fn add(self, o: SquaredNorms) -> SquaredNorms {
        SquaredNorms { param: self.param + o.param, update: self.update + o.update }
    }
}

/// The per-step scalars, computed in f64 and rounded to f32 once.
#[derive(Clone, Copy, Debug)]
struct Scalars {
    rule: Rule,
    grad_scale: f32,
    wd: f32,
    lr: f32,
    // LAMB
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    bias_correction1: f32,
    bias_correction2_sqrt: f32,
    eps: f32,
    // LARS
    momentum: f32,
}

impl Scalars {
    fn new(cfg: &LayerwiseConfig, step: u64, grad_scale: f32, decay: bool) -> Self {
        assert!(step >= 1, "optimizer steps count from 1");
        let wd = if decay { cfg.weight_decay } else { 0.0 };
        let mut k = Scalars {
            rule: cfg.rule,
            grad_scale,
            wd: wd as f32,
            lr: cfg.lr as f32,
            one_minus_beta1: 0.0,
            beta2: 0.0,
            one_minus_beta2: 0.0,
            bias_correction1: 1.0,
            bias_correction2_sqrt: 1.0,
            eps: 0.0,
            momentum: 0.0,
        };
        match cfg.rule {
            Rule::Lamb { beta1, beta2, eps } => {
                k.one_minus_beta1 = (1.0 - beta1) as f32;
                let (bc1, _) = crate::adam::bias_corrections(beta1, beta2, step);
                let bc2;
                (k.beta2, k.one_minus_beta2, bc2) = crate::adam::second_moment(beta2, step, cfg.variance_frozen_after);
                k.bias_correction1 = bc1 as f32;
                k.bias_correction2_sqrt = bc2.sqrt() as f32;
                k.eps = eps as f32;
            }
            Rule::Lars { momentum, .. } => {
                assert!(cfg.variance_frozen_after.is_none(), "LARS keeps no variance to freeze");
                k.momentum = momentum as f32;
            }
        }
        k
    }

    /// LAMB's moments updated with the gradient, element by element, and each element's u into `u`
    /// (all of one length).
    #[inline(always)]
    fn lamb_moments(&self, p: &[f32], m: &mut [f32], v: &mut [f32], grads: &[f32], u: &mut [f32]) {
        for ((((p, m), v), g), u) in p.iter().zip(m.iter_mut()).zip(v.iter_mut()).zip(grads).zip(u.iter_mut()) {
            let g = g * self.grad_scale;
            *m += self.one_minus_beta1 * (g - *m);
            *v = self.beta2 * *v + self.one_minus_beta2 * g * g;
            *u = self.lamb_update(*p, *m, *v);
        }
    }

    /// LAMB's u for one element whose moments are already this step's.
    #[inline(always)]
    fn lamb_update(&self, p: f32, m: f32, v: f32) -> f32 {
        (m / self.bias_correction1) / (v.sqrt() / self.bias_correction2_sqrt + self.eps) + self.wd * p
    }
}

/// Independent partial sums per block: the squares of elements i with i % 8 == j go to lane j, and
/// the lanes are added in order at the end. A fixed order (the same bits on every CPU and thread
/// count) that still lets the loop run as vectors instead of one chain of dependent additions.
const LANES: usize = 8;

/// Adds the squares of `x` (at most [`LANES`] values) into the lanes, value j into lane j.
#[inline(always)]
fn add_squares(acc: &mut [f64; LANES], x: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(x) {
        *a += x as f64 * x as f64;
    }
}

/// The lanes added in order.
fn lanes_total(acc: &[f64; LANES]) -> f64 {
    acc.iter().fold(0.0, |s, a| s + a)
}

/// The squared norm of `x * scale`, by lanes (element i in lane i % 8): whole lanes' worth at a time,
/// so the loop runs as vectors, then the tail.
#[inline(always)]
fn sum_squares(x: &[f32], scale: f32) -> f64 {
    let mut acc = [0.0f64; LANES];
    let whole = x.chunks_exact(LANES);
    let tail = whole.remainder();
    for c in whole {
        let c: &[f32; LANES] = c.try_into().expect("a lane");
        add_squares(&mut acc, &c.map(|x| x * scale));
    }
    let mut scaled = [0.0f32; LANES];
    tail.iter().zip(scaled.iter_mut()).for_each(|(x, s)| *s = x * scale);
    add_squares(&mut acc, &scaled[..tail.len()]);
    lanes_total(&acc)
}

thread_local! {
    /// LAMB's u of one block: pass 1 writes it element by element, then sums its squares. Two plain
    /// loops, each compiled to whole vectors; written as one, the compiler split it into 4-wide pieces
    /// with the lanes spilled to the stack (0.35 Gparam/s, 47% of triad, with AVX-512). Borrowed
    /// outside the instruction-set builds: a closure passed to `with` is compiled for the baseline.
    static BLOCK_UPDATE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Pass 1 over one block (or the part of one a slice holds): LAMB's moments, and the block's squared
/// norms, its pieces added in order; the first piece is `first_piece` elements long (the rest of the
/// piece the block starts in), the others [`NORM_PIECE_ELEMS`]. With `pieces`, each piece's norms are
/// pushed there too. `scratch` holds LAMB's u of the block ([`BLOCK_UPDATE`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn measure_block(
    k: &Scalars,
    p: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: &[f32],
    first_piece: usize,
    scratch: &mut Vec<f32>,
    mut pieces: Option<&mut Vec<SquaredNorms>>,
) -> SquaredNorms {
    let n = p.len();
    let (m, grads) = (&mut m[..n], &grads[..n]);
    let (update, scale): (&[f32], f32) = match k.rule {
        Rule::Lamb { .. } => {
            if scratch.len() < n {
                scratch.resize(n, 0.0);
            }
            k.lamb_moments(p, m, &mut v[..n], grads, &mut scratch[..n]);
            (&scratch[..n], 1.0)
        }
        Rule::Lars { .. } => (grads, k.grad_scale),
    };
    let mut block = SquaredNorms::default();
    let (mut s, mut len) = (0, first_piece);
    while s < n {
        let e = (s + len).min(n);
        let piece = SquaredNorms { param: sum_squares(&p[s..e], 1.0), update: sum_squares(&update[s..e], scale) };
        block = block + piece;
        if let Some(pieces) = pieces.as_deref_mut() {
            pieces.push(piece);
        }
        (s, len) = (e, NORM_PIECE_ELEMS);
    }
    block
}

/// Pass 2 over one block: the step with the tensor's trust ratio, and the copy.
#[inline(always)]
fn apply_block(k: &Scalars, trust: f32, p: &mut [f32], m: &mut [f32], v: &[f32], grads: &[f32], copy: &mut ParamCopy<'_>) {
    let n = p.len();
    let (m, grads) = (&mut m[..n], &grads[..n]);
    match k.rule {
        Rule::Lamb { .. } => {
            let step = k.lr * trust;
            for ((p, m), v) in p.iter_mut().zip(m.iter()).zip(&v[..n]) {
                *p -= step * k.lamb_update(*p, *m, *v);
            }
        }
        Rule::Lars { .. } => {
            for ((p, m), g) in p.iter_mut().zip(m.iter_mut()).zip(grads) {
                let d = (g * k.grad_scale + k.wd * *p) * trust;
                *m = k.momentum * *m + d;
                *p -= k.lr * *m;
            }
        }
    }
    match copy {
        ParamCopy::None => {}
        ParamCopy::F32(out) => out.copy_from_slice(p),
        // Eight at a time where the CPU has F16C: the same bits as `f16::from_f32` (nearest even).
        ParamCopy::F16(out) => out.convert_from_f32_slice(p),
        ParamCopy::Bf16(out) => out.iter_mut().zip(p.iter()).for_each(|(o, &x)| *o = bf16_from_f32(x)),
    }
}

/// The block passes compiled for AVX-512 and AVX2 as well as the baseline, the instruction set chosen
/// at run time ([`Isa`]). FMA is enabled but never used (Rust contracts no multiply-add), so every build
/// gives the same bits.
mod wide {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    #[allow(clippy::too_many_arguments, reason = "measure_block's, one for one")]
    fn measure_avx512(
        k: &Scalars,
        p: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: &[f32],
        first: usize,
        s: &mut Vec<f32>,
        pieces: Pieces,
    ) -> SquaredNorms {
        measure_block(k, p, m, v, grads, first, s, pieces)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    fn apply_avx512(k: &Scalars, trust: f32, p: &mut [f32], m: &mut [f32], v: &[f32], grads: &[f32], copy: &mut ParamCopy<'_>) {
        apply_block(k, trust, p, m, v, grads, copy)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, reason = "measure_block's, one for one")]
    fn measure_avx2(
        k: &Scalars,
        p: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: &[f32],
        first: usize,
        s: &mut Vec<f32>,
        pieces: Pieces,
    ) -> SquaredNorms {
        measure_block(k, p, m, v, grads, first, s, pieces)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn apply_avx2(k: &Scalars, trust: f32, p: &mut [f32], m: &mut [f32], v: &[f32], grads: &[f32], copy: &mut ParamCopy<'_>) {
        apply_block(k, trust, p, m, v, grads, copy)
    }

    /// Where a block's pieces go, when they are kept.
    pub(super) type Pieces<'a> = Option<&'a mut Vec<SquaredNorms>>;

    #[allow(clippy::too_many_arguments)]
    pub(super) fn measure(
        isa: Isa,
        k: &Scalars,
        p: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: &[f32],
        first: usize,
        pieces: Pieces,
    ) -> SquaredNorms {
        BLOCK_UPDATE.with_borrow_mut(|s| match isa {
            // SAFETY: a `Layerwise` holds only an instruction set this CPU has (checked in `with_isa`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { measure_avx512(k, p, m, v, grads, first, s, pieces) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { measure_avx2(k, p, m, v, grads, first, s, pieces) },
            _ => measure_block(k, p, m, v, grads, first, s, pieces),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        isa: Isa,
        k: &Scalars,
        trust: f32,
        p: &mut [f32],
        m: &mut [f32],
        v: &[f32],
        grads: &[f32],
        copy: &mut ParamCopy<'_>,
    ) {
        match isa {
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { apply_avx512(k, trust, p, m, v, grads, copy) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { apply_avx2(k, trust, p, m, v, grads, copy) },
            _ => apply_block(k, trust, p, m, v, grads, copy),
        }
    }
}

/// The trust ratio of a whole tensor from its summed squared norms (1 for tensors without decay).
pub fn trust_ratio(cfg: &LayerwiseConfig, norms: SquaredNorms, decay: bool) -> f32 {
    if !decay {
        return 1.0;
    }
    let (p, u) = (norms.param.sqrt() as f32, norms.update.sqrt() as f32);
    if p <= 0.0 || u <= 0.0 {
        return 1.0;
    }
    match cfg.rule {
        Rule::Lamb { .. } => p / u,
        Rule::Lars { trust_coefficient, .. } => trust_coefficient as f32 * p / (u + cfg.weight_decay as f32 * p),
    }
}

/// The reference: one whole tensor (the first of its group, so its pieces and blocks start with it),
/// one element and one block at a time, no threads. Kept beside the
/// fast path as the oracle the tests compare it with. `v` is empty for LARS.
#[allow(clippy::too_many_arguments, reason = "the fast path's arguments, one for one")]
pub fn layerwise_reference(
    cfg: &LayerwiseConfig,
    p: &mut [f32],
    m: &mut [f32],
    v: &mut [f32],
    grads: &[f32],
    copy: ParamCopy<'_>,
    step: u64,
    grad_scale: f32,
    decay: bool,
) {
    let k = Scalars::new(cfg, step, grad_scale, decay);
    let n = p.len();
    let mut norms = SquaredNorms::default();
    let mut scratch = Vec::new();
    for s in (0..n).step_by(NORM_BLOCK_ELEMS) {
        let e = (s + NORM_BLOCK_ELEMS).min(n);
        let vb: &mut [f32] = if v.is_empty() { &mut [] } else { &mut v[s..e] };
        norms = norms + measure_block(&k, &p[s..e], &mut m[s..e], vb, &grads[s..e], NORM_PIECE_ELEMS, &mut scratch, None);
    }
    let trust = trust_ratio(cfg, norms, decay);
    let mut copy = copy;
    apply_block(&k, trust, p, m, v, grads, &mut copy);
}

/// The fast path: both passes in blocks on a rayon pool of a chosen size.
pub struct Layerwise {
    pub config: LayerwiseConfig,
    pool: rayon::ThreadPool,
    isa: Isa,
}

impl Layerwise {
    /// `threads` = 0 means one per core; the widest instruction set this CPU has.
    pub fn new(config: LayerwiseConfig, threads: usize) -> Self {
        Self::with_isa(config, threads, Isa::detect())
    }

    /// As [`Self::new`] with a chosen instruction set, so that tests run every build. Panics if this CPU
    /// lacks it ([`Isa::available`]): the unsafe calls into its build rely on this check.
    pub fn with_isa(config: LayerwiseConfig, threads: usize, isa: Isa) -> Self {
        isa.assert_available();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("building the optimizer thread pool");
        Layerwise { config, pool, isa }
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn check_lens(&self, p: usize, m: usize, v: usize, grads: usize) {
        let v_expected = if self.config.moments() == 2 { p } else { 0 };
        assert!(m == p && v == v_expected && grads == p, "layer-wise optimizer: p, moments and grads must agree in length");
    }

    /// Pass 1 over a part of one tensor: LAMB's moments updated, and the part's squared norms by the
    /// group's blocks ([`PartNorms`]); `at` is the part's first element's place in its group. `v` is
    /// empty for LARS.
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        p: &[f32],
        m: &mut [f32],
        v: &mut [f32],
        grads: &[f32],
        step: u64,
        grad_scale: f32,
        decay: bool,
        at: usize,
    ) -> PartNorms {
        self.check_lens(p.len(), m.len(), v.len(), grads.len());
        let k = Scalars::new(&self.config, step, grad_scale, decay);
        let n = p.len();
        // The part cut where the group's blocks start.
        let mut cuts = vec![0];
        let mut next = (NORM_BLOCK_ELEMS - at % NORM_BLOCK_ELEMS).min(n);
        while next < n {
            cuts.push(next);
            next = (next + NORM_BLOCK_ELEMS).min(n);
        }
        cuts.push(n);
        let blocks = cuts.len() - 1;
        let (mut m_rest, mut v_rest) = (m, v);
        let mut chunks = Vec::with_capacity(blocks);
        for (i, w) in cuts.windows(2).enumerate() {
            let len = w[1] - w[0];
            let (mb, mr) = std::mem::take(&mut m_rest).split_at_mut(len);
            let (vb, vr) = if v_rest.is_empty() { (&mut [][..], &mut [][..]) } else { std::mem::take(&mut v_rest).split_at_mut(len) };
            (m_rest, v_rest) = (mr, vr);
            let first_piece = NORM_PIECE_ELEMS - (at + w[0]) % NORM_PIECE_ELEMS;
            let edge = i == 0 || i == blocks - 1;
            chunks.push((&p[w[0]..w[1]], mb, vb, &grads[w[0]..w[1]], first_piece, edge));
        }
        let measured: Vec<(SquaredNorms, Option<Vec<SquaredNorms>>)> = self.pool.install(|| {
            chunks
                .into_par_iter()
                .map(|(p, m, v, g, first_piece, edge)| {
                    let mut pieces = edge.then(|| Vec::with_capacity(NORM_BLOCK_ELEMS / NORM_PIECE_ELEMS));
                    let block = wide::measure(self.isa, &k, p, m, v, g, first_piece, pieces.as_mut());
                    (block, pieces)
                })
                .collect()
        });
        let first_block = at / NORM_BLOCK_ELEMS;
        let mut part = PartNorms { first_block, blocks: Vec::with_capacity(blocks), edges: Vec::new() };
        for (i, (block, pieces)) in measured.into_iter().enumerate() {
            part.blocks.push(block);
            if let Some(pieces) = pieces {
                let start = at + cuts[i];
                part.edges.push((first_block + i, start % NORM_BLOCK_ELEMS / NORM_PIECE_ELEMS, pieces));
            }
        }
        part
    }

    /// The trust ratio of a whole tensor from its squared norms summed over every slice.
    pub fn trust_ratio(&self, norms: SquaredNorms, decay: bool) -> f32 {
        trust_ratio(&self.config, norms, decay)
    }

    /// Pass 2 over the same slice: the step with the tensor's `trust` ratio, and the copy written.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &self,
        p: &mut [f32],
        m: &mut [f32],
        v: &[f32],
        grads: &[f32],
        copy: ParamCopy<'_>,
        step: u64,
        grad_scale: f32,
        decay: bool,
        trust: f32,
    ) {
        self.check_lens(p.len(), m.len(), v.len(), grads.len());
        let n = p.len();
        let k = Scalars::new(&self.config, step, grad_scale, decay);
        let blocks = n.div_ceil(NORM_BLOCK_ELEMS);
        let copies: Vec<ParamCopy<'_>> = match copy {
            ParamCopy::None => (0..blocks).map(|_| ParamCopy::None).collect(),
            ParamCopy::F32(out) => out[..n].chunks_mut(NORM_BLOCK_ELEMS).map(ParamCopy::F32).collect(),
            ParamCopy::F16(out) => out[..n].chunks_mut(NORM_BLOCK_ELEMS).map(ParamCopy::F16).collect(),
            ParamCopy::Bf16(out) => out[..n].chunks_mut(NORM_BLOCK_ELEMS).map(ParamCopy::Bf16).collect(),
        };
        let vs: Vec<&[f32]> = if v.is_empty() { vec![&[][..]; blocks] } else { v.chunks(NORM_BLOCK_ELEMS).collect() };
        self.pool.install(|| {
            p.par_chunks_mut(NORM_BLOCK_ELEMS)
                .zip(m.par_chunks_mut(NORM_BLOCK_ELEMS))
                .zip(vs.into_par_iter().zip(grads.par_chunks(NORM_BLOCK_ELEMS)))
                .zip(copies.into_par_iter())
                .for_each(|(((p, m), (v, g)), mut c)| wide::apply(self.isa, &k, trust, p, m, v, g, &mut c));
        });
    }
}
