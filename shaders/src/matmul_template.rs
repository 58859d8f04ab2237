//! The fp32 matmul's variants: `wgsl/matmul.wgsl` is a template whose holes (names in double braces) this module fills
//! from a [`MatmulTile`] (workgroup tile, K step, per-invocation tile, buffers, vector loads), writing
//! the accumulators and the unrolled multiply-adds out as named variables (an indexed function-scope
//! array would likely land in local memory).
//!
//! Every variant computes every element of C as one chain of FMAs in increasing k from the same
//! initial value (the template's header says why), so all variants give the same bits and a tuner may
//! choose among them freely; `engine/tests/matmul_variants.rs` holds them to each other and to the twin.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::{Kernel, Rendered};

/// The template, with the shared Params and bindings prepended (as the `kernels!` table does).
const TEMPLATE: &str = concat!(
    include_str!("../wgsl/common/matmul_params.wgsl"),
    include_str!("../wgsl/common/matmul_io.wgsl"),
    include_str!("../wgsl/matmul.wgsl")
);

/// One variant of the fp32 matmul kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MatmulTile {
    /// Rows of C per workgroup.
    pub tile_m: u32,
    /// Columns of C per workgroup.
    pub tile_n: u32,
    /// K per step through workgroup memory.
    pub tile_k: u32,
    /// Rows of C per invocation (4 or 8: groups of 4 rows, each an aligned vec4 of the A tile).
    pub thread_m: u32,
    /// Columns of C per invocation (4 or 8).
    pub thread_n: u32,
    /// Two workgroup buffers per operand (one barrier per K step) or one (two barriers).
    pub double_buffer: bool,
    /// vec4 global loads of aligned interior quads (else scalar loads everywhere).
    pub vector_loads: bool,
}

impl MatmulTile {
    /// The kernel as it was before variants: what every adapter runs until it is tuned (and the
    /// vendor defaults say otherwise).
    pub const DEFAULT: MatmulTile =
        MatmulTile { tile_m: 128, tile_n: 128, tile_k: 8, thread_m: 8, thread_n: 8, double_buffer: true, vector_loads: true };

    /// The variants `zerostream tune` tries, the default first. Each fits 16 KiB of workgroup memory
    /// (every Vulkan/Metal/DX12 device's minimum) and 256 invocations, except where noted by
    /// [`Self::workgroup_bytes`]: the tuner skips those an adapter cannot run.
    pub const CANDIDATES: [MatmulTile; 14] = [
        Self::DEFAULT,
        MatmulTile { double_buffer: false, ..Self::DEFAULT },
        MatmulTile { tile_k: 16, ..Self::DEFAULT },
        MatmulTile { tile_m: 64, tile_n: 128, ..Self::DEFAULT },
        MatmulTile { tile_m: 128, tile_n: 64, ..Self::DEFAULT },
        MatmulTile { tile_m: 64, tile_n: 64, ..Self::DEFAULT },
        MatmulTile { tile_m: 64, tile_n: 64, tile_k: 16, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
        MatmulTile { tile_m: 64, tile_n: 64, tile_k: 16, ..Self::DEFAULT },
        MatmulTile { tile_m: 32, tile_n: 64, tile_k: 16, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
        MatmulTile { tile_k: 16, thread_m: 8, thread_n: 8, vector_loads: false, ..Self::DEFAULT },
        // For skinny products on wide GPUs: an H100 ran a 768 x 768 x 4096 dW at 22% of peak with the
        // best of the above (144 workgroups of 64 x 64 for 132 SMs); 32 x 32 makes 576.
        MatmulTile { tile_m: 32, tile_n: 32, tile_k: 16, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
        // That one on an H200 (14.8 TFLOP/s, 0.22 of peak): 64 invocations a workgroup, about 9 warps an
        // SM, each K step's loads in flight behind only 16 multiply-adds per output; a 32-deep K step
        // halves the barriers per multiply-add and doubles the loads in flight (16 KiB, the minimum).
        MatmulTile { tile_m: 32, tile_n: 32, tile_k: 32, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
        // Tiles that divide GPT-2's widths into about two workgroups per SM (768 = 16 x 48: 256 for a
        // 768 x 768 dW on 132 SMs, where 32 x 32 leaves a fifth round a third full and 64 x 64 a second
        // round of 12), at 144 invocations; the K step of 12 fits 16 KiB, 24 needs 18 KiB.
        MatmulTile { tile_m: 48, tile_n: 48, tile_k: 12, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
        MatmulTile { tile_m: 48, tile_n: 48, tile_k: 24, thread_m: 4, thread_n: 4, ..Self::DEFAULT },
    ];

    /// A stable name: `128x128x8/8x8/db/v4` (workgroup tile x K step / per-invocation tile / `db`
    /// two buffers or `sb` one / `v4` vector loads or `v1` scalar).
    pub fn name(&self) -> String {
        format!(
            "{}x{}x{}/{}x{}/{}/{}",
            self.tile_m,
            self.tile_n,
            self.tile_k,
            self.thread_m,
            self.thread_n,
            if self.double_buffer { "db" } else { "sb" },
            if self.vector_loads { "v4" } else { "v1" }
        )
    }

    /// Parses [`Self::name`]'s form; the variant must also be [`Self::check`]ed.
    pub fn parse(name: &str) -> Result<MatmulTile, String> {
        let bad = || format!("matmul variant {name:?}: expected the form 128x128x8/8x8/db/v4");
        let parts: Vec<&str> = name.split('/').collect();
        let [tile, thread, buffers, loads] = parts[..] else { return Err(bad()) };
        let nums = |s: &str| s.split('x').map(|n| n.parse::<u32>().map_err(|_| bad())).collect::<Result<Vec<u32>, String>>();
        let (tile, thread) = (nums(tile)?, nums(thread)?);
        let (&[tile_m, tile_n, tile_k], &[thread_m, thread_n]) = (&tile[..], &thread[..]) else { return Err(bad()) };
        let double_buffer = match buffers {
            "db" => true,
            "sb" => false,
            _ => return Err(bad()),
        };
        let vector_loads = match loads {
            "v4" => true,
            "v1" => false,
            _ => return Err(bad()),
        };
        let tile = MatmulTile { tile_m, tile_n, tile_k, thread_m, thread_n, double_buffer, vector_loads };
        tile.check().map_err(|e| format!("matmul variant {name:?}: {e}"))?;
        Ok(tile)
    }

    /// Invocations per workgroup.
    pub const fn workgroup_size(&self) -> u32 {
        if self.thread_m == 0 || self.thread_n == 0 {
            return 0; // refused by check()
        }
        (self.tile_m / self.thread_m) * (self.tile_n / self.thread_n)
    }

    /// Workgroup memory the variant declares: its buffers of a TILE_K-deep tile of A and of B, f32.
    pub const fn workgroup_bytes(&self) -> u32 {
        self.buffers() * self.tile_k * (self.tile_m + self.tile_n) * 4
    }

    const fn buffers(&self) -> u32 {
        if self.double_buffer { 2 } else { 1 }
    }

    /// vec4 of A's tile each invocation loads per K step.
    fn loads_a(&self) -> u32 {
        self.tile_m / 4 * self.tile_k / self.workgroup_size()
    }

    /// vec4 of B's tile each invocation loads per K step.
    fn loads_b(&self) -> u32 {
        self.tile_n / 4 * self.tile_k / self.workgroup_size()
    }

    /// Whether the template can be filled for this variant: the tiles divide into invocations and into
    /// whole vec4 loads, and the workgroup is at most 256 invocations.
    pub fn check(&self) -> Result<(), String> {
        let t = self;
        if ![4, 8].contains(&t.thread_m) || ![4, 8].contains(&t.thread_n) || t.tile_m == 0 || t.tile_n == 0 {
            return Err(format!("the per-invocation tile {}x{} must be 4 or 8 each way", t.thread_m, t.thread_n));
        }
        // Row groups of 4 are spaced tile / (thread / 4) apart and must start on whole vec4.
        if !t.tile_m.is_multiple_of(4 * t.thread_m) || !t.tile_n.is_multiple_of(4 * t.thread_n) {
            return Err(format!("the tile {}x{} must be a multiple of 4x the per-invocation tile", t.tile_m, t.tile_n));
        }
        if t.tile_k == 0 || !t.tile_k.is_multiple_of(4) {
            return Err(format!("the K step {} must be a positive multiple of 4", t.tile_k));
        }
        let size = t.workgroup_size();
        if !(32..=256).contains(&size) {
            // (also catches a zero-sized workgroup)
            return Err(format!("{size} invocations per workgroup (32 to 256 allowed)"));
        }
        for (operand, quads) in [("A", t.tile_m / 4 * t.tile_k), ("B", t.tile_n / 4 * t.tile_k)] {
            if quads < size || !quads.is_multiple_of(size) {
                return Err(format!("{operand}'s tile has {quads} vec4 per K step, not a whole number per invocation ({size})"));
            }
        }
        Ok(())
    }

    /// The WGSL of this variant: the template with its holes filled. Panics on a variant that fails
    /// [`Self::check`] (callers check first; the candidates all pass, tested).
    pub fn source(&self) -> String {
        self.check().unwrap_or_else(|e| panic!("matmul variant {}: {e}", self.name()));
        crate::fill_holes(TEMPLATE, "matmul.wgsl", &self.holes())
    }

    /// This variant as a [`Kernel`] (its source rendered once per process and kept: the engine's pipeline
    /// cache keys on the name).
    pub fn kernel(&self) -> Kernel {
        static RENDERED: Rendered<MatmulTile> = Rendered::new(Default::default);
        crate::rendered(&RENDERED, *self, || (format!("matmul {}", self.name()), self.source()))
    }

    /// Row offsets of this invocation's rows from its first (group g of 4 at g * tile_m / (thread_m / 4)).
    fn row_offsets(&self) -> Vec<u32> {
        let spacing = self.tile_m / (self.thread_m / 4);
        (0..self.thread_m).map(|i| (i / 4) * spacing + i % 4).collect()
    }

    /// Column offsets of this invocation's column groups (each 4 wide).
    fn col_offsets(&self) -> Vec<u32> {
        let spacing = self.tile_n / (self.thread_n / 4);
        (0..self.thread_n / 4).map(|h| h * spacing).collect()
    }

    fn holes(&self) -> HashMap<&'static str, String> {
        let t = self;
        let rows = t.row_offsets();
        let cols = t.col_offsets();
        let size = t.workgroup_size();
        let mut acc = String::new();
        let mut multiply = String::new();
        let mut store_c = String::new();
        for (i, r) in rows.iter().enumerate() {
            for (h, c) in cols.iter().enumerate() {
                let _ = writeln!(acc, "    var acc{i}_{h} = initial4(r0 + {r}u, c0 + {c}u);");
                let _ = writeln!(store_c, "    store4(r0 + {r}u, c0 + {c}u, acc{i}_{h});");
            }
        }
        // Operands from workgroup memory: one vec4 of A per group of 4 rows, one of B per column group.
        for g in 0..t.thread_m / 4 {
            let _ = writeln!(multiply, "            let a{g} = a_tile[a_base + {}u + ty];", g * (t.tile_m / 4) / (t.thread_m / 4));
        }
        for h in 0..t.thread_n / 4 {
            let _ = writeln!(multiply, "            let b{h} = b_tile[b_base + {}u + tx];", h * (t.tile_n / 4) / (t.thread_n / 4));
        }
        for i in 0..t.thread_m {
            let lane = ["x", "y", "z", "w"][(i % 4) as usize];
            for h in 0..t.thread_n / 4 {
                let _ = writeln!(multiply, "            acc{i}_{h} = fma(vec4<f32>(a{}.{lane}), b{h}, acc{i}_{h});", i / 4);
            }
        }
        // The global loads: quad q = li + j * WORKGROUP of each operand's tile, into named registers.
        let (mut first, mut next, mut store_next) = (String::new(), String::new(), String::new());
        let next_buf = if t.double_buffer { "1u - buf" } else { "0u" };
        for (operand, loads, load) in [("a", t.loads_a(), "load_a(row0, {K}, {Q})"), ("b", t.loads_b(), "load_b({K}, col0, {Q})")] {
            for j in 0..loads {
                let q = if j == 0 { "li".to_string() } else { format!("li + {}u", j * size) };
                let call = |k: &str| load.replace("{K}", k).replace("{Q}", &q);
                let _ = writeln!(first, "    var next_{operand}{j} = {};", call("0u"));
                let _ = writeln!(first, "    store_{operand}(0u, {q}, next_{operand}{j});");
                let _ = writeln!(next, "            next_{operand}{j} = {};", call("(t + 1u) * TILE_K"));
                let _ = writeln!(store_next, "            store_{operand}({next_buf}, {q}, next_{operand}{j});");
            }
        }
        let store_next = if t.double_buffer {
            format!(
                "        if (more) {{\n            // The other buffer was last read before the previous barrier: free to overwrite.\n{store_next}        }}"
            )
        } else {
            format!(
                "        // One buffer: every invocation must be done reading it before it is overwritten.\n        workgroupBarrier();\n        if (more) {{\n{store_next}        }}"
            )
        };
        let strip = |s: String| s.trim_end_matches('\n').to_string();
        HashMap::from([
            ("NAME", t.name()),
            ("TILE_M", t.tile_m.to_string()),
            ("TILE_N", t.tile_n.to_string()),
            ("TILE_K", t.tile_k.to_string()),
            ("TILE_M4", (t.tile_m / 4).to_string()),
            ("TILE_N4", (t.tile_n / 4).to_string()),
            ("K4", (t.tile_k / 4).to_string()),
            ("THREADS_N", (t.tile_n / t.thread_n).to_string()),
            ("VECTOR_LOADS", t.vector_loads.to_string()),
            ("A_TILE_VEC4", (t.buffers() * t.tile_k * t.tile_m / 4).to_string()),
            ("B_TILE_VEC4", (t.buffers() * t.tile_k * t.tile_n / 4).to_string()),
            ("WORKGROUP", size.to_string()),
            ("BUF", if t.double_buffer { "t % 2u".to_string() } else { "0u".to_string() }),
            ("ACCUMULATORS", strip(acc)),
            ("LOAD_FIRST", strip(first)),
            ("LOAD_NEXT", strip(next)),
            ("MULTIPLY", strip(multiply)),
            ("STORE_NEXT", store_next),
            ("STORE_C", strip(store_c)),
        ])
    }
}

impl std::fmt::Display for MatmulTile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_valid_distinct_and_named_reversibly() {
        for (i, t) in MatmulTile::CANDIDATES.iter().enumerate() {
            t.check().unwrap_or_else(|e| panic!("{}: {e}", t.name()));
            assert_eq!(MatmulTile::parse(&t.name()).unwrap(), *t);
            assert!(MatmulTile::CANDIDATES[..i].iter().all(|u| u != t), "{} listed twice", t.name());
        }
        assert_eq!(MatmulTile::CANDIDATES[0], MatmulTile::DEFAULT);
        assert_eq!(MatmulTile::DEFAULT.workgroup_bytes(), 16384);
        assert_eq!(MatmulTile::DEFAULT.workgroup_size(), 256);
    }

    #[test]
    fn bad_variants_are_refused_by_name() {
        for (name, why) in [
            ("128x128x8/8x8/db", "expected the form"),
            ("128x128x6/8x8/db/v4", "multiple of 4"),
            ("128x128x8/2x8/db/v4", "4 or 8"),
            ("256x256x8/4x4/db/v4", "invocations"),
            ("32x32x4/4x4/db/v4", "whole number"),
            ("100x128x8/8x8/db/v4", "multiple of 4x"),
        ] {
            let e = MatmulTile::parse(name).unwrap_err();
            assert!(e.contains(why) && e.contains(name), "{name}: {e}");
        }
    }

    /// The default variant's rendering keeps the hand-written kernel's structure: 16 accumulators, one
    /// load of each operand per K step, one barrier in the loop.
    #[test]
    fn default_rendering_has_the_expected_shape() {
        let src = MatmulTile::DEFAULT.source();
        assert!(!src.contains("{{"), "a hole left unfilled");
        assert_eq!(src.matches("= initial4(").count(), 16);
        assert_eq!(src.matches("= fma(").count(), 16);
        assert_eq!(src.matches("next_a0 = load_a").count(), 2);
        assert!(!src.contains("next_a1"));
        assert_eq!(src.matches("workgroupBarrier()").count(), 2);
        let single = MatmulTile { double_buffer: false, ..MatmulTile::DEFAULT }.source();
        assert_eq!(single.matches("workgroupBarrier()").count(), 3);
        let small = MatmulTile::parse("64x64x16/4x4/db/v4").unwrap().source();
        assert_eq!(small.matches("= fma(").count(), 4);
        assert!(small.contains("@workgroup_size(256, 1, 1)"));
    }
}
