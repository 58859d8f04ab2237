//! The cooperative-matrix matmul's variants: `wgsl/matmul_coop.wgsl` is a template whose holes this module
//! fills from a [`CoopTile`] (cooperative size, workgroup tile, K step, accumulators per subgroup,
//! invocations), writing the accumulators, the staged loads and the multiply-adds out as named variables.
//!
//! Every variant of one cooperative size sums each accumulator as the same chain of multiply-adds over K's
//! blocks in increasing k (the template's header says why), so they all give the same bits and a tuner may
//! choose among them freely; `engine/tests/kernels_coop.rs` holds them to each other and to the twin where an
//! adapter has cooperative matrices. The size itself (16 on NVIDIA, 8 on Mesa's lavapipe) is the adapter's.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::{Kernel, Rendered};

/// The staged template, with its enable directives and the shared helpers, Params, bindings and epilogue
/// prepended.
const TEMPLATE: &str = concat!(
    include_str!("../wgsl/common/enable_f16_coop.wgsl"),
    include_str!("../wgsl/common/matmul_params.wgsl"),
    include_str!("../wgsl/common/matmul_io.wgsl"),
    include_str!("../wgsl/common/f16_bits.wgsl"),
    include_str!("../wgsl/common/matmul_coop_epilogue.wgsl"),
    include_str!("../wgsl/common/matmul_coop_elements.wgsl"),
    include_str!("../wgsl/matmul_coop.wgsl")
);

/// The staged template again with chunk loads (operands packed by `pack_f16.wgsl`, staged 16 bytes per
/// load) in place of the element loads.
const WIDE_TEMPLATE: &str = concat!(
    include_str!("../wgsl/common/enable_f16_coop.wgsl"),
    include_str!("../wgsl/common/matmul_params.wgsl"),
    include_str!("../wgsl/common/matmul_coop_epilogue.wgsl"),
    include_str!("../wgsl/common/matmul_coop_chunks.wgsl"),
    include_str!("../wgsl/matmul_coop.wgsl")
);

/// The direct template (operands packed by `pack_f16.wgsl`, loaded straight from storage memory).
const DIRECT_TEMPLATE: &str = concat!(
    include_str!("../wgsl/common/enable_f16_coop.wgsl"),
    include_str!("../wgsl/common/matmul_params.wgsl"),
    include_str!("../wgsl/common/matmul_coop_epilogue.wgsl"),
    include_str!("../wgsl/matmul_coop_direct.wgsl")
);

/// One variant of the cooperative-matrix matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CoopTile {
    /// The cooperative matrices' size: COOP x COOP x COOP f16 products summed in f32 (8 or 16).
    pub coop: u32,
    /// Rows of C per workgroup.
    pub tile_m: u32,
    /// Columns of C per workgroup.
    pub tile_n: u32,
    /// K per step through workgroup memory (a multiple of `coop` and of 8).
    pub tile_k: u32,
    /// Cooperative accumulators per subgroup along M.
    pub frag_m: u32,
    /// Cooperative accumulators per subgroup along N.
    pub frag_n: u32,
    /// Invocations per workgroup.
    pub workgroup: u32,
    /// How A and B reach the cooperative loads. Every way gives the same bits.
    pub loads: Loads,
}

/// How a variant's A and B reach its cooperative loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Loads {
    /// Staged through the workgroup tiles element by element, each rounded to f16 as it is loaded
    /// (`wgsl/matmul_coop.wgsl` with `common/matmul_coop_elements.wgsl`).
    Elements,
    /// As `Elements`, from A (and an f32 B) already rounded to f16 in a scratch buffer (the engine casts
    /// each operand's span once, with the same rounding), so the kernel reads halves instead of rounding
    /// every element on every workgroup that loads it (`/pc`).
    Precast,
    /// Straight from A and B packed by the engine (`pack_f16.wgsl`: rounded to f16, padded to whole
    /// tiles), `tile_k / coop` blocks at a time, with no workgroup tiles
    /// (`wgsl/matmul_coop_direct.wgsl`, `/dg`).
    Direct,
    /// Staged through the workgroup tiles from A and B packed as for `Direct`, 8 halves (16 bytes) per
    /// load and no bounds checks (`wgsl/matmul_coop.wgsl` with `common/matmul_coop_chunks.wgsl`, `/ws`).
    Wide,
}

impl Loads {
    /// The name's suffix.
    const fn suffix(self) -> &'static str {
        match self {
            Loads::Elements => "",
            Loads::Precast => "/pc",
            Loads::Direct => "/dg",
            Loads::Wide => "/ws",
        }
    }

    /// Whether the engine packs A and B for it (`pack_f16.wgsl`).
    pub const fn packs_operands(self) -> bool {
        matches!(self, Loads::Direct | Loads::Wide)
    }
}

/// A region of C per subgroup and a workgroup shape, independent of the cooperative size: (tile_m, tile_n,
/// tile_k, region_m, region_n, workgroup).
type Shape = (u32, u32, u32, u32, u32, u32);

/// The shapes `zerostream tune` tries, the default first (the kernel as it was before variants), each
/// also with precast operands where [`PRECAST_SHAPES`] says. Each fits
/// 48 KiB of workgroup memory (NVIDIA's Vulkan limit) at COOP = 16; [`CoopTile::workgroup_bytes`] says
/// what each needs, and the tuner skips those an adapter cannot hold.
const SHAPES: [Shape; 7] = [
    (128, 128, 32, 32, 64, 256),
    // A deeper K step: half the barriers per K.
    (128, 128, 64, 32, 64, 256),
    // A 64 x 64 region per subgroup (4 x 4 accumulators at COOP 16): more products per cooperative load.
    (128, 128, 32, 64, 64, 128),
    // Wider tiles along N: each A element staged once serves 256 columns.
    (128, 256, 32, 64, 64, 256),
    // Smaller tiles for skinny products (N = 768 on 132 SMs).
    (64, 64, 32, 32, 32, 128),
    (64, 128, 32, 32, 64, 128),
    (128, 64, 32, 32, 32, 256),
];

/// Which of [`SHAPES`] are also tried with precast operands.
const PRECAST_SHAPES: [usize; 4] = [0, 1, 2, 4];

/// Which of [`SHAPES`] are also tried as direct variants (their K step is the K loaded before the
/// multiply-adds; their workgroup memory only the epilogue's slots).
const DIRECT_SHAPES: [usize; 5] = [0, 1, 2, 3, 4];

/// Which of [`SHAPES`] are also tried with wide staging: all of them (on an H200 the wide variants beat
/// every other kind in 28 of 32 classes, benches/results/2026-11-27-h200-gpu-wide.md; the small tiles are
/// for the skinny products, whose 128 x 128 tiles leave most SMs idle).
const WIDE_SHAPES: [usize; 7] = [0, 1, 2, 3, 4, 5, 6];

impl CoopTile {
    /// The variant the device runs for a cooperative size until it is tuned: the kernel as it was before
    /// variants (a 128 x 128 tile, a 32 x 64 region per subgroup, 256 invocations, K step 32).
    pub const fn default_for(coop: u32) -> CoopTile {
        Self::from_shape(coop, SHAPES[0])
    }

    const fn from_shape(coop: u32, (tile_m, tile_n, tile_k, region_m, region_n, workgroup): Shape) -> CoopTile {
        CoopTile { coop, tile_m, tile_n, tile_k, frag_m: region_m / coop, frag_n: region_n / coop, workgroup, loads: Loads::Elements }
    }

    /// The variants `zerostream tune` tries for a cooperative size, the default first: the shapes whose
    /// regions make at most 32 accumulators of that size.
    pub fn candidates(coop: u32) -> Vec<CoopTile> {
        let plain = SHAPES.iter().map(|s| Self::from_shape(coop, *s));
        let with = |loads, shapes: &'static [usize]| shapes.iter().map(move |&i| CoopTile { loads, ..Self::from_shape(coop, SHAPES[i]) });
        let precast = with(Loads::Precast, &PRECAST_SHAPES);
        let packed = with(Loads::Direct, &DIRECT_SHAPES).chain(with(Loads::Wide, &WIDE_SHAPES));
        plain.chain(precast).chain(packed).filter(|t| t.check().is_ok()).collect()
    }

    /// A stable name: `c16/128x128x32/2x4/256` (cooperative size / workgroup tile x K step / accumulators
    /// per subgroup / invocations), and after it `/pc` for precast operands, `/dg` for the direct kernel,
    /// `/ws` for wide staging ([`Loads`]).
    pub fn name(&self) -> String {
        format!(
            "c{}/{}x{}x{}/{}x{}/{}{}",
            self.coop,
            self.tile_m,
            self.tile_n,
            self.tile_k,
            self.frag_m,
            self.frag_n,
            self.workgroup,
            self.loads.suffix()
        )
    }

    /// Parses [`Self::name`]'s form and checks the variant.
    pub fn parse(name: &str) -> Result<CoopTile, String> {
        let bad = || format!("cooperative matmul variant {name:?}: expected the form c16/128x128x32/2x4/256[/pc|/dg|/ws]");
        let parts: Vec<&str> = name.split('/').collect();
        let (loads, parts) = match parts[..] {
            [ref head @ .., "pc"] => (Loads::Precast, head),
            [ref head @ .., "dg"] => (Loads::Direct, head),
            [ref head @ .., "ws"] => (Loads::Wide, head),
            ref all => (Loads::Elements, all),
        };
        let [coop, tile, frags, workgroup] = parts[..] else { return Err(bad()) };
        let num = |s: &str| s.parse::<u32>().map_err(|_| bad());
        let nums = |s: &str| s.split('x').map(num).collect::<Result<Vec<u32>, String>>();
        let coop = num(coop.strip_prefix('c').ok_or_else(bad)?)?;
        let (tile, frags, workgroup) = (nums(tile)?, nums(frags)?, num(workgroup)?);
        let (&[tile_m, tile_n, tile_k], &[frag_m, frag_n]) = (&tile[..], &frags[..]) else { return Err(bad()) };
        let t = CoopTile { coop, tile_m, tile_n, tile_k, frag_m, frag_n, workgroup, loads };
        t.check().map_err(|e| format!("cooperative matmul variant {name:?}: {e}"))?;
        Ok(t)
    }

    const fn region_m(&self) -> u32 {
        self.frag_m * self.coop
    }

    const fn region_n(&self) -> u32 {
        self.frag_n * self.coop
    }

    /// Regions (one subgroup's share) per workgroup tile.
    pub const fn regions(&self) -> u32 {
        if self.region_m() == 0 || self.region_n() == 0 {
            return 0; // refused by check()
        }
        (self.tile_m / self.region_m()) * (self.tile_n / self.region_n())
    }

    const fn a_stride(&self) -> u32 {
        self.tile_k + 8
    }

    const fn b_stride(&self) -> u32 {
        self.tile_n + 8
    }

    /// f16 elements of the tiles' array (A's, then B's), rounded up to 16 bytes.
    const fn tile_halves(&self) -> u32 {
        (self.tile_m * self.a_stride() + self.tile_k * self.b_stride()).div_ceil(8) * 8
    }

    /// f32 elements of the staging array: a COOP x COOP slot per region and the dump slot, then the
    /// subgroup count and padding to 16 bytes.
    const fn c_stage(&self) -> u32 {
        (self.regions() + 1) * self.coop * self.coop + 4
    }

    /// Workgroup memory the variant declares (a direct variant: the epilogue's slots only).
    pub const fn workgroup_bytes(&self) -> u32 {
        if matches!(self.loads, Loads::Direct) { self.c_stage() * 4 } else { self.tile_halves() * 2 + self.c_stage() * 4 }
    }

    /// Whether the template can be filled for this variant: the regions tile the workgroup tile, the K
    /// step is whole cooperative blocks, the staging divides into invocations, and every place in the tiles
    /// fits the 16 bits the staged loads keep it in.
    pub fn check(&self) -> Result<(), String> {
        let t = self;
        // Bounds first, so the products below cannot overflow (a hand-edited table names any numbers).
        if t.tile_m > 512 || t.tile_n > 512 || t.tile_k > 256 || t.frag_m > 32 || t.frag_n > 32 {
            return Err(format!("the tile {}x{}x{} or {}x{} accumulators out of range", t.tile_m, t.tile_n, t.tile_k, t.frag_m, t.frag_n));
        }
        if ![8, 16].contains(&t.coop) {
            return Err(format!("the cooperative size {} must be 8 or 16", t.coop));
        }
        if t.frag_m == 0 || t.frag_n == 0 || t.frag_m * t.frag_n > 32 {
            return Err(format!("{}x{} accumulators per subgroup (1 to 32 in all)", t.frag_m, t.frag_n));
        }
        if t.tile_m == 0 || t.tile_n == 0 || !t.tile_m.is_multiple_of(t.region_m()) || !t.tile_n.is_multiple_of(t.region_n()) {
            return Err(format!("the tile {}x{} must be a whole number of {}x{} regions", t.tile_m, t.tile_n, t.region_m(), t.region_n()));
        }
        if t.tile_k == 0 || !t.tile_k.is_multiple_of(t.coop) || !t.tile_k.is_multiple_of(8) {
            return Err(format!("the K step {} must be a positive multiple of {} and of 8", t.tile_k, t.coop));
        }
        if ![64, 128, 256].contains(&t.workgroup) {
            return Err(format!("{} invocations per workgroup (64, 128 or 256 allowed)", t.workgroup));
        }
        for (operand, elements) in [("A", t.tile_m * t.tile_k), ("B", t.tile_k * t.tile_n)] {
            if elements < t.workgroup || !elements.is_multiple_of(t.workgroup) {
                return Err(format!(
                    "{operand}'s tile has {elements} elements per K step, not a whole number per invocation ({})",
                    t.workgroup
                ));
            }
        }
        if t.tile_halves() > 1 << 16 {
            return Err(format!("the tiles hold {} halves, more than a 16-bit place can address", t.tile_halves()));
        }
        if t.loads == Loads::Wide {
            for (operand, elements) in [("A", t.tile_m * t.tile_k), ("B", t.tile_k * t.tile_n)] {
                if !elements.is_multiple_of(8 * t.workgroup) {
                    return Err(format!("{operand}'s tile has {elements} halves per K step, not 8 per load for each of {}", t.workgroup));
                }
            }
        }
        Ok(())
    }

    /// The WGSL of this variant: the template with its holes filled. Panics on a variant that fails
    /// [`Self::check`] (callers check first; the candidates all pass, tested).
    pub fn source(&self) -> String {
        self.check().unwrap_or_else(|e| panic!("cooperative matmul variant {}: {e}", self.name()));
        match self.loads {
            Loads::Elements | Loads::Precast => crate::fill_holes(TEMPLATE, "matmul_coop.wgsl", &self.holes()),
            Loads::Direct => crate::fill_holes(DIRECT_TEMPLATE, "matmul_coop_direct.wgsl", &self.direct_holes()),
            Loads::Wide => crate::fill_holes(WIDE_TEMPLATE, "matmul_coop.wgsl", &self.holes()),
        }
    }

    /// This variant as a [`Kernel`] (its source rendered once per process and kept: the engine's pipeline
    /// cache keys on the name).
    pub fn kernel(&self) -> Kernel {
        static RENDERED: Rendered<CoopTile> = Rendered::new(Default::default);
        crate::rendered(&RENDERED, *self, || (format!("matmul_coop {}", self.name()), self.source()))
    }

    fn coop_type(&self, elem: &str, role: &str) -> String {
        format!("coop_mat{0}x{0}<{elem}, {role}>", self.coop)
    }

    /// The holes both templates have: the variant's constants, its accumulators and their flush.
    fn common_holes(&self) -> HashMap<&'static str, String> {
        let t = self;
        let (mut accumulators, mut flush) = (String::new(), String::new());
        for i in 0..t.frag_m {
            for j in 0..t.frag_n {
                let _ = writeln!(accumulators, "        var acc{i}_{j} = {}();", t.coop_type("f32", "C"));
                let _ = writeln!(flush, "        flush_tile(acc{i}_{j}, slot, {i}u, {j}u, first, end, row0, col0, li);");
            }
        }
        HashMap::from([
            ("NAME", t.name()),
            ("COOP", t.coop.to_string()),
            ("TILE_M", t.tile_m.to_string()),
            ("TILE_N", t.tile_n.to_string()),
            ("TILE_K", t.tile_k.to_string()),
            ("REGION_M", t.region_m().to_string()),
            ("REGION_N", t.region_n().to_string()),
            ("REGIONS_N", (t.tile_n / t.region_n()).to_string()),
            ("REGIONS", t.regions().to_string()),
            ("SLOT", (t.coop * t.coop).to_string()),
            ("COUNT_SLOT", ((t.regions() + 1) * t.coop * t.coop).to_string()),
            ("C_STAGE", t.c_stage().to_string()),
            ("WORKGROUP", t.workgroup.to_string()),
            ("ACCUMULATORS", strip(accumulators)),
            ("FLUSH", strip(flush)),
        ])
    }

    /// The direct template's holes: per step, the fragments of `tile_k / coop` blocks loaded from the packed
    /// operands, then every accumulator's multiply-adds block by block (increasing k); per tail block, the
    /// same for one block.
    fn direct_holes(&self) -> HashMap<&'static str, String> {
        let t = self;
        let blocks = |n: u32| {
            let (mut loads, mut products) = (String::new(), String::new());
            for s in 0..n {
                for i in 0..t.frag_m {
                    let at = format!("a_at + {}u * sa + k0 + {}u", i * t.coop, s * t.coop);
                    let _ = writeln!(loads, "            let a{s}_{i} = coopLoadT<{}>(&ah[{at}], sa);", t.coop_type("f16", "A"));
                }
                for j in 0..t.frag_n {
                    let at = format!("b_at + (k0 + {}u) * sb + {}u", s * t.coop, j * t.coop);
                    let _ = writeln!(loads, "            let b{s}_{j} = coopLoadT<{}>(&bh[{at}], sb);", t.coop_type("f16", "B"));
                }
                for i in 0..t.frag_m {
                    for j in 0..t.frag_n {
                        let _ = writeln!(products, "            acc{i}_{j} = coopMultiplyAdd(a{s}_{i}, b{s}_{j}, acc{i}_{j});");
                    }
                }
            }
            strip(loads + &products)
        };
        let mut holes = self.common_holes();
        holes.insert("MULTIPLY_STEP", blocks(t.tile_k / t.coop));
        holes.insert("MULTIPLY_BLOCK", blocks(1));
        holes
    }

    fn holes(&self) -> HashMap<&'static str, String> {
        let t = self;
        let coop_type = |elem: &str, role: &str| t.coop_type(elem, role);
        let mut multiply = String::new();
        // Per COOP-deep block of the K step: the region's fragments of A and B from workgroup memory, then
        // every accumulator's multiply-add.
        for i in 0..t.frag_m {
            let _ = writeln!(
                multiply,
                "                let a{i} = coopLoadT<{}>(&tile_halves[a_base + {}u * A_STRIDE + kk], A_STRIDE);",
                coop_type("f16", "A"),
                i * t.coop
            );
        }
        for j in 0..t.frag_n {
            let _ = writeln!(
                multiply,
                "                let b{j} = coopLoadT<{}>(&tile_halves[kk * B_STRIDE + b_base + {}u], B_STRIDE);",
                coop_type("f16", "B"),
                j * t.coop
            );
        }
        for i in 0..t.frag_m {
            for j in 0..t.frag_n {
                let _ = writeln!(multiply, "                acc{i}_{j} = coopMultiplyAdd(a{i}, b{j}, acc{i}_{j});");
            }
        }
        // The staged loads into named registers: load j of an invocation is element (wide: 16-byte chunk)
        // li + j * WORKGROUP of each operand's tile; {R} is the register, {K} the step's k, {Q} the index.
        let (a_load, b_load, register, store_call, per_load) = match t.loads {
            Loads::Wide => ("load_a8(row0, col0, {K}, {Q})", "load_b8(row0, col0, {K}, {Q})", "chunk", "store_{O}8({Q}, {R})", 8),
            _ => ("load_a(row0, {K}, {Q})", "load_b({K}, col0, {Q})", "staged", "store_half({R})", 1),
        };
        let (mut first, mut next, mut store) = (String::new(), String::new(), String::new());
        for (operand, elements, call) in [("a", t.tile_m * t.tile_k, a_load), ("b", t.tile_k * t.tile_n, b_load)] {
            for j in 0..elements / per_load / t.workgroup {
                let q = if j == 0 { "li".to_string() } else { format!("li + {}u", j * t.workgroup) };
                let r = format!("{register}_{operand}{j}");
                let fill = |text: &str, k: &str| text.replace("{K}", k).replace("{Q}", &q).replace("{R}", &r).replace("{O}", operand);
                let _ = writeln!(first, "        var {r} = {};", fill(call, "0u"));
                let _ = writeln!(next, "                {r} = {};", fill(call, "(t + 1u) * TILE_K"));
                let _ = writeln!(store, "            {};", fill(store_call, ""));
            }
        }
        let mut holes = self.common_holes();
        holes.extend([
            ("A_STRIDE", t.a_stride().to_string()),
            ("B_STRIDE", t.b_stride().to_string()),
            ("B_TILE", (t.tile_m * t.a_stride()).to_string()),
            ("TILE_HALVES", t.tile_halves().to_string()),
            ("A_PRECAST", (t.loads == Loads::Precast).to_string()),
            ("LOAD_FIRST", strip(first)),
            ("STORE", strip(store)),
            ("LOAD_NEXT", strip(next)),
            ("MULTIPLY", strip(multiply)),
        ]);
        holes
    }
}

/// Generated lines without their last newline (a hole sits on a line of its own).
fn strip(s: String) -> String {
    s.trim_end_matches('\n').to_string()
}

/// The probe of the cooperative multiply-add's own rate at cooperative size `coop` (`wgsl/coop_probe.wgsl`):
/// what `bench kernels` times beside the matmul. Its output holds [`COOP_PROBE_SUBGROUPS`] x 8 slots of
/// `coop` x `coop` f32, then the workgroup's subgroup count.
pub fn coop_probe_kernel(coop: u32) -> Kernel {
    assert!([8, 16].contains(&coop), "cooperative size {coop}");
    static RENDERED: Rendered<u32> = Rendered::new(Default::default);
    crate::rendered(&RENDERED, coop, || {
        let slot = coop * coop;
        let holes = HashMap::from([
            ("COOP", coop.to_string()),
            ("SLOT", slot.to_string()),
            ("COUNT_AT", coop_probe_count_at(coop).to_string()),
            ("TILE_HALVES", (6 * slot).to_string()),
        ]);
        let template = concat!(include_str!("../wgsl/common/enable_f16_coop.wgsl"), include_str!("../wgsl/coop_probe.wgsl"));
        (format!("coop_probe c{coop}"), crate::fill_holes(template, "coop_probe.wgsl", &holes))
    })
}

/// Subgroup slots of the probe's output (the subgroup id modulo this).
pub const COOP_PROBE_SUBGROUPS: u32 = 64;

/// Where the probe writes the subgroup count: after its slots.
pub const fn coop_probe_count_at(coop: u32) -> u32 {
    COOP_PROBE_SUBGROUPS * 8 * coop * coop
}

impl std::fmt::Display for CoopTile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests;
