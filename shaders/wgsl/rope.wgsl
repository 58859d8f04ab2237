// rope: rotary position embedding, transformers' rotate-half convention, in place on `heads` heads of
// head_dim D starting at column col_offset of each row of x (rows, row_stride); row r is position
// t = r % T. For i < D/2: angle = f32(t) * inv_freq[i], (a, b) = (x[i], x[i + D/2]) ->
// (a cos - b sin, b cos + a sin); `inverse` rotates by -angle (RoPE's backward, applied to the gradient).
// One thread per (row, i): it computes sin and cos once and rotates pair i of every head.
//
// x_off locates (first row of the piece, col_offset) in the bound window; first_row is that row's index
// in the whole tensor, for the position.

struct Params { rows: u32, rows_per_seq: u32, row_stride: u32, heads: u32, half_dim: u32, x_off: u32, first_row: u32, inverse: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

// Not the built-in sin and cos: WGSL bounds their error only inside [-pi, pi] (by 2^-11), and angles
// reach thousands of radians. The angle is reduced against pi/2 split into four 6-bit pieces (times 2^-5,
// 2^-11, 2^-17, 2^-23) and an f32 tail: for quadrants below 2^18 (angles below 411,774) the four products
// and differences are exact, fused or not (lavapipe does not fuse fma), and only the tail rounds. Cephes'
// single-precision polynomials then run on [-pi/4, pi/4]: about 1.5 ulp, the same operations as sincos
// in engine/src/ops/rope.rs. The constants are f32 values written exactly.
const TWO_OVER_PI: f32 = 0.6366197466850281;
const PIO2_1: f32 = 1.5625;
const PIO2_2: f32 = 0.0078125;
const PIO2_3: f32 = 0.00048065185546875;
const PIO2_4: f32 = 3.0994415283203125e-06;
const PIO2_TAIL: f32 = 7.549790126404332e-08;
const S1: f32 = -0.16666655242443085;
const S2: f32 = 0.008332161232829094;
const S3: f32 = -0.00019515295571181923;
const C1: f32 = 0.04166664555668831;
const C2: f32 = -0.0013887316454201937;
const C3: f32 = 2.44331567955669e-05;

// (sin(angle), cos(angle)).
fn sincos(angle: f32) -> vec2<f32> {
    let j = round(angle * TWO_OVER_PI); // ties to even, as the twin's round_ties_even
    var r = angle - j * PIO2_1;
    r -= j * PIO2_2;
    r -= j * PIO2_3;
    r -= j * PIO2_4;
    r = fma(-j, PIO2_TAIL, r);
    let z = r * r;
    let s = fma(fma(fma(S3, z, S2), z, S1) * z, r, r);
    let c = fma(fma(fma(C3, z, C2), z, C1) * z, z, fma(-0.5, z, 1.0));
    switch (i32(j) & 3) {
        case 0: { return vec2<f32>(s, c); }
        case 1: { return vec2<f32>(c, -s); }
        case 2: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 256u;
    if (idx >= p.rows * p.half_dim) { return; }
    let row = idx / p.half_dim;
    let i = idx % p.half_dim;
    let t = (p.first_row + row) % p.rows_per_seq;
    let sc = sincos(f32(t) * inv_freq[i]);
    let sin_a = select(sc.x, -sc.x, p.inverse != 0u);
    let cos_a = sc.y;
    let base = p.x_off + row * p.row_stride + i;
    let head_dim = 2u * p.half_dim;
    for (var h = 0u; h < p.heads; h++) {
        let lo = base + h * head_dim;
        let a = x[lo];
        let b = x[lo + p.half_dim];
        x[lo] = fma(a, cos_a, -(b * sin_a));
        x[lo + p.half_dim] = fma(b, cos_a, a * sin_a);
    }
}
