//! The attention kernels' variants: `wgsl/attention_forward.wgsl`, `wgsl/attention_backward.wgsl` and
//! `wgsl/attention_decode.wgsl`, with `wgsl/common/attention_tiles.wgsl`, are templates whose holes
//! (names in double braces) this module fills from an [`AttentionTile`]. The forward and the decode
//! kernel share one online-softmax loop (`wgsl/common/attention_rows.wgsl`), so generation with a
//! key/value cache gives the full forward's bits.
//!
//! Only what leaves every output element's arithmetic unchanged varies: how many tile rows (queries,
//! or keys for dk and dv) one workgroup takes, and so how many invocations it has. The key tile (32
//! keys, over which the forward's online softmax sums and rescales at once) and the 8 lanes per row
//! (whose partial sums are added in lane order) are fixed, so each row folds the same tiles in the
//! same order in every variant; tiles a variant visits beyond another's hold only masked pairs, which
//! add exact zeros (the kernels' headers say why). So all variants give the same bits and a tuner may
//! choose among them freely; `engine/tests/attention_variants.rs` holds them to each other and to the twin.

use std::collections::HashMap;

use crate::{Kernel, Rendered};

/// Shared helpers of both kernels, as the `kernels!` table prepends them.
const COMMON: &str = concat!(
    include_str!("../wgsl/common/dropout_mask.wgsl"),
    include_str!("../wgsl/common/attention_params.wgsl"),
    include_str!("../wgsl/common/attention_tiles.wgsl")
);
/// The online-softmax walk over key tiles, which the forward and the decode kernel both run.
const ROWS_LOOP: &str = include_str!("../wgsl/common/attention_rows.wgsl");
const FORWARD: &str = include_str!("../wgsl/attention_forward.wgsl");
const BACKWARD: &str = include_str!("../wgsl/attention_backward.wgsl");
const DECODE: &str = include_str!("../wgsl/attention_decode.wgsl");

/// Which of the two templated kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttentionPass {
    /// `attention_forward.wgsl` (`main`).
    Forward,
    /// `attention_backward.wgsl` (`query_grad`, then `key_value_grad`).
    Backward,
}

impl AttentionPass {
    pub const ALL: [AttentionPass; 2] = [AttentionPass::Forward, AttentionPass::Backward];

    /// `forward` or `backward`.
    pub fn name(&self) -> &'static str {
        match self {
            AttentionPass::Forward => "forward",
            AttentionPass::Backward => "backward",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    fn template(&self) -> Template {
        match self {
            AttentionPass::Forward => Template::FORWARD,
            AttentionPass::Backward => Template::BACKWARD,
        }
    }
}

/// One templated kernel file: its name, its text, and whether it runs the shared online-softmax loop.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Template {
    name: &'static str,
    text: &'static str,
    rows_loop: bool,
}

impl Template {
    const FORWARD: Template = Template { name: "attention_forward", text: FORWARD, rows_loop: true };
    const BACKWARD: Template = Template { name: "attention_backward", text: BACKWARD, rows_loop: false };
    const DECODE: Template = Template { name: "attention_decode", text: DECODE, rows_loop: true };
}

/// One variant of the training attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttentionTile {
    /// Tile rows per workgroup: queries (forward, dq) or keys (dk, dv). The grid has ceil(T / rows)
    /// workgroups along x and each has rows x [`Self::LANES_PER_ROW`] invocations.
    pub rows: u32,
}

impl AttentionTile {
    /// Columns of every tile (keys, or queries for dk and dv): fixed, see the module docs.
    pub const COLS: u32 = 32;
    /// Invocations per tile row: fixed, see the module docs.
    pub const LANES_PER_ROW: u32 = 8;
    /// Floats per staged row in workgroup memory (32 channels and a float of padding).
    const STRIDE: u32 = 33;

    /// The kernels as they were before variants: 32 rows, 256 invocations.
    pub const DEFAULT: AttentionTile = AttentionTile { rows: 32 };

    /// The variants `zerostream tune` tries, the default first: smaller workgroups, so more of them for
    /// short sequences and few heads, and less workgroup memory each.
    pub const CANDIDATES: [AttentionTile; 3] = [Self::DEFAULT, AttentionTile { rows: 16 }, AttentionTile { rows: 8 }];

    /// A stable name: `rows32`.
    pub fn name(&self) -> String {
        format!("rows{}", self.rows)
    }

    /// Parses [`Self::name`]'s form and [`Self::check`]s the variant.
    pub fn parse(name: &str) -> Result<AttentionTile, String> {
        let rows = name.strip_prefix("rows").and_then(|n| n.parse::<u32>().ok());
        let tile = AttentionTile { rows: rows.ok_or_else(|| format!("attention variant {name:?}: expected the form rows32"))? };
        tile.check().map_err(|e| format!("attention variant {name:?}: {e}"))?;
        Ok(tile)
    }

    /// Invocations per workgroup.
    pub const fn workgroup_size(&self) -> u32 {
        self.rows * Self::LANES_PER_ROW
    }

    /// Workgroup memory the pass's kernel declares: the staged rows (rows and a key tile's worth), the
    /// tile of values and, per lane, the forward's maxima and sums or the backward's delta parts.
    pub const fn workgroup_bytes(&self, pass: AttentionPass) -> u32 {
        let per_lane = match pass {
            AttentionPass::Forward => 2,
            AttentionPass::Backward => 1,
        };
        4 * ((2 * self.rows + Self::COLS) * Self::STRIDE + per_lane * self.workgroup_size())
    }

    /// Whether the template can be filled for this variant: 1 to 32 rows (at most 256 invocations,
    /// what every adapter allows). Any count works, not only divisors of the key tile (the extra tiles
    /// are masked), so an odd one is a fair test of the claim.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=32).contains(&self.rows) {
            return Err(format!("{} rows per workgroup (1 to 32 allowed: {} invocations each)", self.rows, Self::LANES_PER_ROW));
        }
        Ok(())
    }

    /// The pass's WGSL for this variant: the helpers and the kernel with their holes filled. Panics on a
    /// variant that fails [`Self::check`] (callers check first; the candidates all pass, tested).
    pub fn source(&self, pass: AttentionPass) -> String {
        self.render(pass.template())
    }

    fn render(&self, template: Template) -> String {
        self.check().unwrap_or_else(|e| panic!("attention variant {}: {e}", self.name()));
        let holes = HashMap::from([("ROWS", self.rows.to_string()), ("LANES", self.workgroup_size().to_string())]);
        let rows_loop = if template.rows_loop { ROWS_LOOP } else { "" };
        crate::fill_holes(COMMON, "common/attention_tiles.wgsl", &holes)
            + rows_loop
            + &crate::fill_holes(template.text, template.name, &holes)
    }

    /// The pass's kernel for this variant (rendered once per process and kept: the engine's pipeline
    /// cache keys on the name, `attention_forward rows32`).
    pub fn kernel(&self, pass: AttentionPass) -> Kernel {
        self.kernel_of(pass.template())
    }

    /// The decode kernel (`append`, then `main`: new rows against a key/value cache) for this variant.
    /// Its workgroup memory is the forward's.
    pub fn decode_kernel(&self) -> Kernel {
        self.kernel_of(Template::DECODE)
    }

    fn kernel_of(&self, template: Template) -> Kernel {
        static RENDERED: Rendered<(&'static str, AttentionTile)> = Rendered::new(Default::default);
        crate::rendered(&RENDERED, (template.name, *self), || (format!("{} {}", template.name, self.name()), self.render(template)))
    }

    /// Every candidate's kernels: both training passes and decode (validation, compile checks).
    pub fn all_kernels() -> Vec<Kernel> {
        Self::CANDIDATES.iter().flat_map(|t| AttentionPass::ALL.map(|p| t.kernel(p)).into_iter().chain([t.decode_kernel()])).collect()
    }
}

impl std::fmt::Display for AttentionTile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_valid_distinct_and_named_reversibly() {
        for (i, t) in AttentionTile::CANDIDATES.iter().enumerate() {
            assert_eq!(AttentionTile::parse(&t.name()).unwrap(), *t);
            assert!(AttentionTile::CANDIDATES[..i].iter().all(|u| u != t), "{t} listed twice");
        }
        assert_eq!(AttentionTile::CANDIDATES[0], AttentionTile::DEFAULT);
        assert_eq!(AttentionTile::DEFAULT.workgroup_size(), 256);
        // The hand-written kernels' workgroup memory (engine's KERNEL_WORKGROUP_BYTES is the largest).
        assert_eq!(AttentionTile::DEFAULT.workgroup_bytes(AttentionPass::Forward), 14720);
        for name in ["rows0", "rows33", "32", "rowsx"] {
            let e = AttentionTile::parse(name).unwrap_err();
            assert!(e.contains(name), "{e}");
        }
        assert_eq!(AttentionPass::parse("backward"), Some(AttentionPass::Backward));
    }

    /// The default's rendering is the hand-written kernel's: 32 rows, 256 lanes, no hole left.
    #[test]
    fn default_rendering_has_the_expected_shape() {
        for template in [Template::FORWARD, Template::BACKWARD, Template::DECODE] {
            let src = AttentionTile::DEFAULT.render(template);
            assert!(!src.contains("{{"), "a hole left unfilled");
            assert!(src.contains("const ROWS: u32 = 32u;") && src.contains("const LANES: u32 = 256u;"));
            assert!(src.contains("@workgroup_size(256, 1, 1)") && !src.contains("BLOCK"));
            assert_eq!(src.contains("fn attend_rows("), template.rows_loop, "{}", template.name);
            let small = AttentionTile { rows: 5 }.render(template);
            assert!(small.contains("const ROWS: u32 = 5u;") && small.contains("@workgroup_size(40, 1, 1)"));
        }
    }
}
