//! The grouped-query twins against the multi-head twins run on K and V repeated per group (what
//! transformers' `repeat_kv` materialises; only this test does), the dimension checks, and the kernel
//! limits against the WGSL they describe.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wgpu::naga;

use super::*;

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.5..1.5)).collect()
}

/// The qkv of multi-head attention with each key/value head of `d` repeated `heads / kv_heads` times
/// in place, as transformers' `repeat_kv` expands (B, G, T, D) to (B, G * n_rep, T, D).
fn repeat_kv(qkv: &[f32], d: AttentionDims) -> Vec<f32> {
    let (hd, qw, kw) = (d.head_dim, d.q_width(), d.kv_width());
    let n_rep = d.heads / d.kv_heads;
    let mut out = Vec::with_capacity(d.batch * d.seq_len * 3 * qw);
    for row in qkv.chunks(d.qkv_width()) {
        out.extend_from_slice(&row[..qw]);
        for part in [&row[qw..][..kw], &row[qw + kw..][..kw]] {
            for head in part.chunks(hd) {
                for _ in 0..n_rep {
                    out.extend_from_slice(head);
                }
            }
        }
    }
    out
}

struct Run {
    out: Vec<f32>,
    lse: Vec<f32>,
    dqkv: Vec<f32>,
    delta: Vec<f32>,
}

fn run(qkv: &[f32], dout: &[f32], d: AttentionDims) -> Run {
    let rows = d.batch * d.seq_len;
    let (mut out, mut lse) = (vec![0.0; rows * d.out_width()], vec![0.0; d.stat_len()]);
    attention_forward(&mut out, &mut lse, qkv, d);
    // NaN, so a gradient left unwritten shows.
    let (mut dqkv, mut delta) = (vec![f32::NAN; rows * d.qkv_width()], vec![0.0; d.stat_len()]);
    attention_backward(&mut dqkv, &mut delta, dout, qkv, &out, &lse, d);
    Run { out, lse, dqkv, delta }
}

#[test]
fn grouped_query_attention_is_multi_head_attention_on_repeated_kv() {
    for (heads, kv_heads, head_dim, batch, seq_len) in
        [(4, 2, 12, 2, 9), (4, 1, 5, 1, 17), (6, 3, 8, 3, 4), (3, 1, 3, 1, 1), (2, 2, 4, 2, 6)]
    {
        let d = AttentionDims::gqa(batch, seq_len, heads, kv_heads, head_dim);
        let mha = AttentionDims::mha(batch, seq_len, heads * head_dim, heads);
        let tag = format!("H{heads} G{kv_heads} D{head_dim} B{batch} T{seq_len}");
        let seed = (heads * 100 + kv_heads * 10 + head_dim) as u64;
        let qkv = random(seed, batch * seq_len * d.qkv_width());
        let dout = random(seed + 1, batch * seq_len * d.out_width());
        let (got, want) = (run(&qkv, &dout, d), run(&repeat_kv(&qkv, d), &dout, mha));
        // The same products in the same order: equal to the bit.
        assert_eq!(got.out, want.out, "{tag}: out");
        assert_eq!(got.lse, want.lse, "{tag}: lse");
        assert_eq!(got.delta, want.delta, "{tag}: delta");
        let (qw, kw) = (d.q_width(), d.kv_width());
        for (r, (g_row, w_row)) in got.dqkv.chunks(d.qkv_width()).zip(want.dqkv.chunks(mha.qkv_width())).enumerate() {
            assert_eq!(g_row[..qw], w_row[..qw], "{tag}: dq of row {r}");
            // A shared head's gradient is the sum of its repeated copies' gradients (summed here per
            // copy, there in one running sum: equal up to rounding).
            for (part, mha_part) in [(qw, qw), (qw + kw, 2 * qw)] {
                for e in 0..kw {
                    let (g, c) = (e / head_dim, e % head_dim);
                    let copies: f32 = (g * d.group()..(g + 1) * d.group()).map(|h| w_row[mha_part + h * head_dim + c]).sum();
                    let got = g_row[part + e];
                    assert!((got - copies).abs() <= 1e-5 * (1.0 + copies.abs()), "{tag}: row {r} part {part} [{e}]: {got} vs {copies}");
                }
            }
        }
    }
}

#[test]
fn dimensions_are_checked_with_the_numbers() {
    let ok = AttentionDims::gqa(2, 64, 32, 8, 128);
    assert!(ok.check().is_ok() && ok.check_kernel_limits(usize::MAX, 16384).is_ok());
    assert_eq!((ok.group(), ok.kv_head(5), ok.kv_head(31), ok.q_width(), ok.kv_width(), ok.qkv_width()), (4, 1, 7, 4096, 1024, 6144));
    let gpt2 = AttentionDims::mha(4, 16, 768, 12);
    assert_eq!((gpt2.kv_heads, gpt2.head_dim, gpt2.qkv_width(), gpt2.out_width(), gpt2.stat_len()), (12, 64, 2304, 768, 4 * 12 * 16));

    let err = |d: AttentionDims| d.check_kernel_limits(1 << 20, 16384).unwrap_err().to_string();
    assert!(err(AttentionDims { kv_heads: 3, ..ok }).contains("32 query heads do not split into groups over 3"));
    assert!(err(AttentionDims { kv_heads: 0, ..ok }).contains("at least one"));
    assert!(err(AttentionDims { head_dim: 0, ..ok }).contains("at least one"));
    assert!(err(AttentionDims { head_dim: 257, ..ok }).contains("head dim 257 is above the 256"));
    assert!(AttentionDims { head_dim: 256, ..ok }.check_kernel_limits(usize::MAX, 16384).is_ok());
    let small_workgroup = ok.check_kernel_limits(usize::MAX, 8192).unwrap_err().to_string();
    assert!(
        small_workgroup.contains(&format!("need {KERNEL_WORKGROUP_BYTES} bytes")) && small_workgroup.contains("allows 8192"),
        "{small_workgroup}"
    );
    // Past the dispatch grid's 65535 workgroups a dimension, with BLOCK positions a workgroup.
    let too_long = AttentionDims { seq_len: 65535 * BLOCK + 1, ..ok }.check_kernel_limits(usize::MAX, 16384).unwrap_err().to_string();
    assert!(too_long.contains(&format!("{} positions", 65535 * BLOCK + 1)) && too_long.contains("at most 65535"), "{too_long}");
    assert!(AttentionDims { seq_len: 65535 * BLOCK, ..ok }.check_kernel_limits(usize::MAX, 16384).is_ok());
    // 64 x 6144 floats of qkv per sequence.
    let long = ok.check_kernel_limits(64 * 6144 - 1, 16384).unwrap_err().to_string();
    assert!(long.contains("1572864 bytes") && long.contains("--seq-len to at most 63"), "{long}");
}

/// The value of a `const` of the module (a u32 literal).
fn constant(module: &naga::Module, name: &str) -> usize {
    let (_, c) = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some(name)).unwrap_or_else(|| panic!("no const {name}"));
    match module.global_expressions[c.init] {
        naga::Expression::Literal(naga::Literal::U32(n)) => n as usize,
        ref e => panic!("const {name} is {e:?}"),
    }
}

#[test]
fn kernel_limits_describe_the_wgsl() {
    let mut largest = 0;
    use zerostream_shaders::{AttentionPass, AttentionTile};
    for kernel in AttentionTile::all_kernels() {
        let module = naga::front::wgsl::parse_str(kernel.source).unwrap();
        let workgroup: Vec<_> =
            module.global_variables.iter().map(|(_, v)| v).filter(|v| v.space == naga::AddressSpace::WorkGroup).collect();
        let bytes = workgroup.iter().map(|v| module.types[v.ty].inner.size(module.to_ctx())).sum::<u32>() as usize;
        let tile = AttentionTile::CANDIDATES.into_iter().find(|t| kernel.name.ends_with(&format!(" {t}"))).unwrap();
        // The blocked kernels' 64-row blocks may need more (the device runs them where they fit); the
        // unblocked ones, whose largest the error for an adapter too small names, fit
        // KERNEL_WORKGROUP_BYTES (and the untuned blocked variant within it: attention_template.rs).
        if tile.lane_rows == 1 {
            assert!(bytes <= KERNEL_WORKGROUP_BYTES, "{}: {bytes} bytes", kernel.name);
            largest = largest.max(bytes);
        }
        // The tiled kernels: the key tile, the channels a row's accumulators hold, and the lanes: each of
        // a row's lanes owns four columns of a tile row and four channels of each chunk. The rows vary
        // per variant; the default's are the grid's block.
        let (cols, chunk, lanes_per_row) = (constant(&module, "COLS"), constant(&module, "CHUNK"), constant(&module, "LANES_PER_ROW"));
        assert_eq!(cols, BLOCK, "{}", kernel.name);
        assert!(chunk * constant(&module, "MAX_CHUNKS") >= MAX_HEAD_DIM, "{}", kernel.name);
        assert_eq!((4 * lanes_per_row, 4 * lanes_per_row), (cols, chunk), "{}", kernel.name);
        let rows = constant(&module, "ROWS");
        assert_eq!(rows, tile.rows as usize, "{}", kernel.name);
        if tile.lane_rows != 1 {
            assert_eq!(constant(&module, "LANE_ROWS"), tile.lane_rows as usize, "{}", kernel.name);
        }
        // Decode runs the forward's loop, with its workgroup memory.
        let pass = if kernel.name.starts_with("attention_backward") { AttentionPass::Backward } else { AttentionPass::Forward };
        assert_eq!(bytes, tile.workgroup_bytes(pass) as usize, "{}", kernel.name);
        if tile == AttentionTile::DEFAULT {
            assert_eq!(rows, BLOCK, "{}", kernel.name);
        }
        // Decode's `append` is elementwise: one invocation per float, 256 per workgroup.
        for entry in module.entry_points.iter().filter(|e| e.name != "append") {
            assert_eq!(entry.workgroup_size[0] as usize, rows * lanes_per_row / tile.lane_rows as usize, "{}: {}", kernel.name, entry.name);
            assert_eq!(entry.workgroup_size[0] as usize, constant(&module, "LANES"), "{}: {}", kernel.name, entry.name);
        }
    }
    assert_eq!(largest, KERNEL_WORKGROUP_BYTES);
}
