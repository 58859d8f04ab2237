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
//!
//! Both passes have a second, register-blocked template (`wgsl/attention_forward_blocked.wgsl`,
//! `wgsl/attention_backward_blocked.wgsl`, with `wgsl/common/attention_blocks.wgsl`): the same sums in the
//! same order with each invocation computing 4 tile rows instead of one ([`AttentionTile::lane_rows`]),
//! so 0.5 floats read from workgroup memory per multiply-add instead of 1.25. Its variants (`rows32x4`) have no
//! decode kernel: decode keeps the online-softmax loop it shares with the unblocked forward.

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
/// The register-blocked tile products of the blocked kernels.
const BLOCKS: &str = include_str!("../wgsl/common/attention_blocks.wgsl");
// Each training kernel after its pass's bindings and addressing, which its two templates share.
const FORWARD: &str = concat!(include_str!("../wgsl/common/attention_forward_io.wgsl"), include_str!("../wgsl/attention_forward.wgsl"));
const BACKWARD: &str = concat!(include_str!("../wgsl/common/attention_backward_io.wgsl"), include_str!("../wgsl/attention_backward.wgsl"));
const FORWARD_BLOCKED: &str =
    concat!(include_str!("../wgsl/common/attention_forward_io.wgsl"), include_str!("../wgsl/attention_forward_blocked.wgsl"));
const BACKWARD_BLOCKED: &str =
    concat!(include_str!("../wgsl/common/attention_backward_io.wgsl"), include_str!("../wgsl/attention_backward_blocked.wgsl"));
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
}

/// One templated kernel file: its name (the kernel's, whichever file), its text, and the helpers it
/// needs beyond [`COMMON`]: the shared online-softmax loop, or the blocked tile products.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Template {
    name: &'static str,
    text: &'static str,
    helpers: &'static str,
}

impl Template {
    const FORWARD: Template = Template { name: "attention_forward", text: FORWARD, helpers: ROWS_LOOP };
    const BACKWARD: Template = Template { name: "attention_backward", text: BACKWARD, helpers: "" };
    const FORWARD_BLOCKED: Template = Template { name: "attention_forward", text: FORWARD_BLOCKED, helpers: BLOCKS };
    const BACKWARD_BLOCKED: Template = Template { name: "attention_backward", text: BACKWARD_BLOCKED, helpers: BLOCKS };
    const DECODE: Template = Template { name: "attention_decode", text: DECODE, helpers: ROWS_LOOP };
}

/// One variant of the training attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttentionTile {
    /// Tile rows per workgroup: queries (forward, dq) or keys (dk, dv). The grid has ceil(T / rows)
    /// workgroups along x and each has rows x [`Self::LANES_PER_ROW`] / `lane_rows` invocations.
    pub rows: u32,
    /// Tile rows per invocation: 1, or [`Self::BLOCKED_LANE_ROWS`] (the `*_blocked.wgsl` kernels).
    pub lane_rows: u32,
}

impl AttentionTile {
    /// Columns of every tile (keys, or queries for dk and dv): fixed, see the module docs.
    pub const COLS: u32 = 32;
    /// Invocations per tile row: fixed, see the module docs.
    pub const LANES_PER_ROW: u32 = 8;
    /// Floats per staged row in workgroup memory (32 channels and a float of padding).
    const STRIDE: u32 = 33;

    /// Tile rows per invocation of the blocked kernels.
    pub const BLOCKED_LANE_ROWS: u32 = 4;

    /// The kernels as they were before variants: 32 rows, 256 invocations.
    pub const DEFAULT: AttentionTile = AttentionTile::rows(32);

    /// The variants `zerostream tune` tries, the default first: smaller workgroups, so more of them for
    /// short sequences and few heads, and less workgroup memory each; then the blocked kernels'.
    pub const CANDIDATES: [AttentionTile; 5] =
        [Self::DEFAULT, AttentionTile::rows(16), AttentionTile::rows(8), AttentionTile::blocked(32), AttentionTile::blocked(64)];

    /// What both passes run where nothing was tuned, or where the table's choice cannot run: the
    /// blocked kernels at the default's 32 rows (0.5 floats read from workgroup memory per multiply-add
    /// against the default's 1.25; 2x as fast at GPT-2's shapes on lavapipe; the same bits). It needs
    /// no more invocations than [`Self::DEFAULT`], nor more workgroup memory than the default's larger
    /// pass; the default stays the reference a tuner checks bits against.
    pub const UNTUNED: AttentionTile = AttentionTile::blocked(32);

    /// `rows` rows per workgroup, one per invocation.
    pub const fn rows(rows: u32) -> Self {
        AttentionTile { rows, lane_rows: 1 }
    }

    /// `rows` rows per workgroup, [`Self::BLOCKED_LANE_ROWS`] per invocation.
    pub const fn blocked(rows: u32) -> Self {
        AttentionTile { rows, lane_rows: Self::BLOCKED_LANE_ROWS }
    }

    /// Whether the variant has a decode kernel: the blocked ones have none (decode runs
    /// `attention_rows.wgsl`'s loop, which gives every variant's bits).
    pub fn has_decode(&self) -> bool {
        self.lane_rows == 1
    }

    /// A stable name: `rows32`, or `rows32x4` for 4 rows per invocation.
    pub fn name(&self) -> String {
        match self.lane_rows {
            1 => format!("rows{}", self.rows),
            n => format!("rows{}x{n}", self.rows),
        }
    }

    /// Parses [`Self::name`]'s form and [`Self::check`]s the variant.
    pub fn parse(name: &str) -> Result<AttentionTile, String> {
        let expected = || format!("attention variant {name:?}: expected the form rows32 or rows32x4");
        let body = name.strip_prefix("rows").ok_or_else(expected)?;
        let (rows, lane_rows) = body.split_once('x').unwrap_or((body, "1"));
        let number = |n: &str| n.parse::<u32>().map_err(|_| expected());
        let tile = AttentionTile { rows: number(rows)?, lane_rows: number(lane_rows)? };
        tile.check().map_err(|e| format!("attention variant {name:?}: {e}"))?;
        Ok(tile)
    }

    /// Invocations per workgroup.
    pub const fn workgroup_size(&self) -> u32 {
        self.rows * Self::LANES_PER_ROW / self.lane_rows
    }

    /// Workgroup memory the pass's kernel declares: the staged rows (rows and a key tile's worth), the
    /// tile of values and, per lane, the forward's maxima and sums or the backward's delta parts.
    /// The blocked forward's are the same per row; the blocked backward's: the same staged rows, each
    /// (row, lane)'s part of delta and each row's delta and log-sum-exp.
    pub const fn workgroup_bytes(&self, pass: AttentionPass) -> u32 {
        let extra = match (pass, self.lane_rows) {
            (AttentionPass::Forward, _) => 2 * self.rows * Self::LANES_PER_ROW,
            (AttentionPass::Backward, 1) => self.workgroup_size(),
            (AttentionPass::Backward, _) => self.rows * Self::LANES_PER_ROW + 2 * self.rows,
        };
        4 * ((2 * self.rows + Self::COLS) * Self::STRIDE + extra)
    }

    /// Whether the template can be filled for this variant: 1 to 32 rows, one per invocation (at most
    /// 256 invocations, what every adapter allows), or a multiple of 4 up to 64, 4 per invocation. Any
    /// count works, not only divisors of the key tile (the extra tiles are masked), so an odd one is a
    /// fair test of the claim.
    pub fn check(&self) -> Result<(), String> {
        match self.lane_rows {
            1 if !(1..=32).contains(&self.rows) => {
                Err(format!("{} rows per workgroup (1 to 32 allowed: {} invocations each)", self.rows, Self::LANES_PER_ROW))
            }
            Self::BLOCKED_LANE_ROWS if !(1..=16).contains(&(self.rows / 4)) || !self.rows.is_multiple_of(4) => {
                Err(format!("{} rows per workgroup, 4 per invocation (a multiple of 4 up to 64 allowed)", self.rows))
            }
            1 | Self::BLOCKED_LANE_ROWS => Ok(()),
            n => Err(format!("{n} rows per invocation (1 or {} allowed)", Self::BLOCKED_LANE_ROWS)),
        }
    }

    /// The pass's WGSL for this variant: the helpers and the kernel with their holes filled. Panics on a
    /// variant that fails [`Self::check`] or has no kernel for the pass (callers check first; the
    /// candidates all pass, tested).
    pub fn source(&self, pass: AttentionPass) -> String {
        self.render(self.template(pass))
    }

    fn template(&self, pass: AttentionPass) -> Template {
        match (pass, self.lane_rows) {
            (AttentionPass::Forward, 1) => Template::FORWARD,
            (AttentionPass::Forward, _) => Template::FORWARD_BLOCKED,
            (AttentionPass::Backward, 1) => Template::BACKWARD,
            (AttentionPass::Backward, _) => Template::BACKWARD_BLOCKED,
        }
    }

    fn render(&self, template: Template) -> String {
        self.check().unwrap_or_else(|e| panic!("attention variant {}: {e}", self.name()));
        let holes = HashMap::from([("ROWS", self.rows.to_string()), ("LANES", self.workgroup_size().to_string())]);
        crate::fill_holes(COMMON, "common/attention_tiles.wgsl", &holes)
            + template.helpers
            + &crate::fill_holes(template.text, template.name, &holes)
    }

    /// The pass's kernel for this variant (rendered once per process and kept: the engine's pipeline
    /// cache keys on the name, `attention_forward rows32`).
    pub fn kernel(&self, pass: AttentionPass) -> Kernel {
        self.kernel_of(self.template(pass))
    }

    /// The decode kernel (`append`, then `main`: new rows against a key/value cache) for this variant.
    /// Its workgroup memory is the forward's. Only for variants with a forward kernel.
    pub fn decode_kernel(&self) -> Kernel {
        assert!(self.has_decode(), "attention variant {} has no decode kernel", self.name());
        self.kernel_of(Template::DECODE)
    }

    fn kernel_of(&self, template: Template) -> Kernel {
        static RENDERED: Rendered<(&'static str, AttentionTile)> = Rendered::new(Default::default);
        crate::rendered(&RENDERED, (template.name, *self), || (format!("{} {}", template.name, self.name()), self.render(template)))
    }

    /// Every candidate's kernels: the training passes it has and, with a forward, decode (validation,
    /// compile checks).
    pub fn all_kernels() -> Vec<Kernel> {
        Self::CANDIDATES.iter().flat_map(AttentionTile::kernels).collect()
    }

    /// This variant's kernels: the training passes it has and, with a forward, decode.
    pub fn kernels(&self) -> Vec<Kernel> {
        let passes = AttentionPass::ALL.into_iter().map(|p| self.kernel(p));
        passes.chain(self.has_decode().then(|| self.decode_kernel())).collect()
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
        assert_eq!(AttentionTile::parse("rows64x4").unwrap(), AttentionTile::blocked(64));
        assert_eq!(AttentionTile::blocked(32).workgroup_size(), 64);
        // The untuned variant runs wherever the default does (the fallback of every other choice).
        let untuned = AttentionTile::UNTUNED;
        assert!(untuned.workgroup_size() <= AttentionTile::DEFAULT.workgroup_size() && untuned.rows == AttentionTile::DEFAULT.rows);
        // (check_attention asks the adapter for the default's largest pass.)
        let largest = |t: AttentionTile| AttentionPass::ALL.map(|p| t.workgroup_bytes(p)).into_iter().max();
        assert!(largest(untuned) <= largest(AttentionTile::DEFAULT));
        for name in ["rows0", "rows33", "32", "rowsx", "rows30x4", "rows68x4", "rows32x2", "rows32x"] {
            let e = AttentionTile::parse(name).unwrap_err();
            assert!(e.contains(name), "{e}");
        }
        assert_eq!(AttentionPass::parse("backward"), Some(AttentionPass::Backward));
    }

    /// The default's rendering is the hand-written kernel's: 32 rows, 256 lanes, no hole left.
    #[test]
    fn default_rendering_has_the_expected_shape() {
        let blocked = AttentionTile::blocked(32).render(Template::BACKWARD_BLOCKED);
        assert!(blocked.contains("const ROWS: u32 = 32u;") && blocked.contains("@workgroup_size(64, 1, 1)") && !blocked.contains("{{"));
        for template in [Template::FORWARD, Template::BACKWARD, Template::DECODE] {
            let src = AttentionTile::DEFAULT.render(template);
            assert!(!src.contains("{{"), "a hole left unfilled");
            assert!(src.contains("const ROWS: u32 = 32u;") && src.contains("const LANES: u32 = 256u;"));
            assert!(src.contains("@workgroup_size(256, 1, 1)") && !src.contains("BLOCK"));
            assert_eq!(src.contains("fn attend_rows("), template.helpers == ROWS_LOOP, "{}", template.name);
            let small = AttentionTile::rows(5).render(template);
            assert!(small.contains("const ROWS: u32 = 5u;") && small.contains("@workgroup_size(40, 1, 1)"));
        }
    }
}
