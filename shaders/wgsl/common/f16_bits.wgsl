// Shared by cast_f32_to_f16.wgsl and matmul_coop.wgsl (prepended to their source).
//
// f32 -> f16 in integer arithmetic, because WGSL leaves the direction of an f32 -> f16 conversion (and
// pack2x16float's), and its result out of range, to the implementation. The twin is `half::f16::from_f32`.
// The f16 bits nearest to x (ties to even), as `half::f16::from_f32`; NaN stays a quiet NaN.
fn f16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    let sign = (u >> 16u) & 0x8000u;
    let mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) { return sign | 0x7e00u | ((mag >> 13u) & 0x3ffu); }
    if (mag >= 0x477ff000u) { return sign | 0x7c00u; } // 65520 and up round past 65504: infinity
    if (mag >= 0x38800000u) {
        // A normal f16: rebias the exponent (127 - 15), round away the low 13 mantissa bits (a carry
        // into the exponent is the correct result).
        let rebased = mag - 0x38000000u;
        return sign | ((rebased + 0xfffu + ((rebased >> 13u) & 1u)) >> 13u);
    }
    let e = mag >> 23u;
    if (e < 102u) { return sign; } // below 2^-25, half the smallest subnormal: zero
    // A subnormal f16: the significand in units of 2^-24, rounded to nearest even.
    let shift = 126u - e; // 14..24
    let sig = (mag & 0x7fffffu) | 0x800000u;
    let q = sig >> shift;
    let rem = sig & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    let up = rem > halfway || (rem == halfway && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}
