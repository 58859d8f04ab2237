//! The WGSL compute kernels of zerostream, one file per op under `wgsl/`, named after the op; helpers
//! several kernels share live in `wgsl/common/` and are prepended to the kernels that list them.
//!
//! This crate only embeds the source text (`include_str!`), so it has no run-time dependencies; the engine
//! compiles the modules on its device. The test at the bottom parses and validates every kernel with naga,
//! so an invalid shader fails `cargo test` here rather than at pipeline creation on some user's GPU, and
//! writes the cooperative-matrix matmul's variants as SPIR-V (as wgpu would on a Vulkan adapter that has
//! cooperative matrices).
//!
//! The fp32 matmul is a template (`wgsl/matmul.wgsl`) rendered per variant by [`MatmulTile`]
//! (`matmul_template.rs`), the cooperative-matrix matmul (`wgsl/matmul_coop.wgsl`) by [`CoopTile`]
//! (`matmul_coop_template.rs`), and the attention kernels (`wgsl/attention_forward.wgsl`,
//! `wgsl/attention_backward.wgsl`, `wgsl/attention_decode.wgsl`) by [`AttentionTile`]
//! (`attention_template.rs`); they are not in [`ALL`], and the tests validate every candidate variant.

pub mod attention_template;
pub mod matmul_coop_template;
pub mod matmul_template;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

pub use attention_template::{AttentionPass, AttentionTile};
pub use matmul_coop_template::{COOP_PROBE_SUBGROUPS, CoopTile, Loads, coop_probe_count_at, coop_probe_kernel};
pub use matmul_template::MatmulTile;

/// `template` with each hole (a name in double braces) replaced by its value in `holes`; `file` names the
/// template in the panic for an unknown or unclosed hole (a bug in this crate, caught by its tests).
pub(crate) fn fill_holes(template: &str, file: &str, holes: &HashMap<&str, String>) -> String {
    let mut out = String::with_capacity(template.len() + 4096);
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let end = start + rest[start..].find("}}").unwrap_or_else(|| panic!("an unclosed {{{{ in {file}"));
        out.push_str(&rest[..start]);
        let key = &rest[start + 2..end];
        let value = holes.get(key).unwrap_or_else(|| panic!("{file}: unknown hole {{{{{key}}}}}"));
        out.push_str(value);
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A templated kernel, rendered once per process per `key` and kept in `cache` (the engine's pipeline
/// cache keys on the name; the strings live as long as the process, as the `include_str!` sources do).
/// `render` gives the name and the source.
pub(crate) fn rendered<K: Copy + Eq + std::hash::Hash>(cache: &Rendered<K>, key: K, render: impl FnOnce() -> (String, String)) -> Kernel {
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    *map.entry(key).or_insert_with(|| {
        let (name, source) = render();
        Kernel { name: Box::leak(name.into_boxed_str()), source: Box::leak(source.into_boxed_str()) }
    })
}

/// A cache for [`rendered`].
pub(crate) type Rendered<K> = LazyLock<Mutex<HashMap<K, Kernel>>>;

/// One kernel: the op's name (the file's stem) and its WGSL source.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
}

impl Kernel {
    /// The names of its entry points (each `@compute` function), in source order: what a pipeline of
    /// this kernel can be created for (`zerostream selftest` compiles every one).
    pub fn entry_points(&self) -> Vec<&'static str> {
        let source = self.source;
        let mut names = Vec::new();
        for (at, _) in source.match_indices("@compute") {
            let rest = &source[at..];
            let Some(fn_at) = rest.find("fn ") else { continue };
            let name = rest[fn_at + 3..].trim_start();
            let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(name.len());
            names.push(&name[..end]);
        }
        names
    }
}

macro_rules! kernels {
    ($($ident:ident => $file:literal $(with $($common:literal),+)?),* $(,)?) => {
        $(pub const $ident: Kernel = Kernel {
            name: $file,
            // Shared helpers from wgsl/common/ are prepended to the kernel's own file.
            source: concat!($($(include_str!(concat!("../wgsl/common/", $common, ".wgsl")),)+)? include_str!(concat!("../wgsl/", $file, ".wgsl"))),
        };)*
        /// Every kernel but the templated ones ([`MatmulTile::kernel`], [`AttentionTile::kernel`]), for
        /// validation.
        pub const ALL: &[Kernel] = &[$($ident),*];
    };
}

kernels! {
    AXPY => "axpy",
    BIAS_BACKWARD => "bias_backward" with "column_lanes",
    CAST_HALF_TO_F32 => "cast_half_to_f32",
    CAST_F32_TO_F16 => "cast_f32_to_f16" with "f16_bits",
    COLUMN_PARTIALS_SUM => "column_partials_sum",
    CROSSENTROPY => "crossentropy" with "workgroup_logsumexp",
    CROSSENTROPY_CHUNK_GRAD => "crossentropy_chunk_grad",
    CROSSENTROPY_CHUNK_STATS => "crossentropy_chunk_stats" with "workgroup_logsumexp",
    DROPOUT => "dropout" with "dropout_mask",
    DROPOUT_RESIDUAL => "dropout_residual" with "dropout_mask",
    ENCODER_BACKWARD => "encoder_backward",
    ENCODER_FORWARD => "encoder_forward",
    FILL => "fill",
    GELU_BACKWARD => "gelu_backward",
    GELU_FORWARD => "gelu_forward",
    GELU_ERF_BACKWARD => "gelu_erf_backward" with "erfc",
    GELU_ERF_FORWARD => "gelu_erf_forward" with "erfc",
    LAYERNORM_BACKWARD => "layernorm_backward" with "workgroup_sum", "column_lanes",
    LAYERNORM_FORWARD => "layernorm_forward" with "workgroup_sum",
    PACK_F16 => "pack_f16" with "f16_bits",
    RELU_BACKWARD => "relu_backward",
    RELU_FORWARD => "relu_forward",
    RESIDUAL_FORWARD => "residual_forward",
    SUM_SQUARES => "sum_squares",
    RMSNORM_BACKWARD => "rmsnorm_backward" with "workgroup_sum", "column_lanes",
    RMSNORM_FORWARD => "rmsnorm_forward" with "workgroup_sum",
    ROPE => "rope",
    SWIGLU_BACKWARD => "swiglu_backward" with "sigmoid",
    SWIGLU_FORWARD => "swiglu_forward" with "sigmoid",
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every candidate variant of the templated kernels.
    fn templated() -> Vec<Kernel> {
        MatmulTile::CANDIDATES.iter().map(MatmulTile::kernel).chain(AttentionTile::all_kernels()).collect()
    }

    #[test]
    fn every_kernel_parses_and_validates() {
        let variants: Vec<Kernel> = templated();
        for kernel in ALL.iter().chain(&variants) {
            let module = naga::front::wgsl::parse_str(kernel.source)
                .unwrap_or_else(|e| panic!("{}.wgsl: {}", kernel.name, e.emit_to_string(kernel.source)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{}.wgsl: {}", kernel.name, e.emit_to_string(kernel.source)));
            assert!(!module.entry_points.is_empty(), "{}.wgsl has no entry point", kernel.name);
            let names: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(kernel.entry_points(), names, "{}.wgsl: Kernel::entry_points", kernel.name);
        }
    }

    /// Every candidate variant of the cooperative-matrix matmul, at both cooperative sizes.
    fn coop_variants() -> Vec<CoopTile> {
        [16, 8].into_iter().flat_map(CoopTile::candidates).collect()
    }

    /// Every cooperative-matrix kernel: the matmul's variants and the probe, at both sizes.
    fn coop_kernels() -> Vec<Kernel> {
        coop_variants().iter().map(CoopTile::kernel).chain([16, 8].map(coop_probe_kernel)).collect()
    }

    /// The cooperative-matrix matmul's variants checked the way wgpu would on a Vulkan adapter that has
    /// cooperative matrices: validated with only the capabilities the engine requests (f16, subgroups,
    /// cooperative matrices, and the f16 packing that every full Vulkan device has and matmul.wgsl already
    /// uses) and written as SPIR-V 1.3 by naga's Vulkan backend.
    #[test]
    fn matmul_coop_validates_and_writes_spirv() {
        use naga::valid::Capabilities as Caps;
        for kernel in coop_kernels() {
            let module = naga::front::wgsl::parse_str(kernel.source)
                .unwrap_or_else(|e| panic!("{}: {}", kernel.name, e.emit_to_string(kernel.source)));
            let caps = Caps::SHADER_FLOAT16 | Caps::SHADER_FLOAT16_IN_FLOAT32 | Caps::SUBGROUP | Caps::COOPERATIVE_MATRIX;
            let validator = |caps| {
                let mut v = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
                v.subgroup_stages(naga::valid::ShaderStages::COMPUTE).subgroup_operations(naga::valid::SubgroupOperationSet::BASIC);
                v
            };
            let info = validator(caps).validate(&module).unwrap_or_else(|e| panic!("{}: {}", kernel.name, e.emit_to_string(kernel.source)));
            // Without the cooperative-matrix capability the module is refused (so the check above means something).
            assert!(validator(caps - Caps::COOPERATIVE_MATRIX).validate(&module).is_err());
            let options = naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
            let pipeline = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
            let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
                .unwrap_or_else(|e| panic!("{} to SPIR-V: {e}", kernel.name));
            assert_eq!(words[0], 0x0723_0203, "SPIR-V magic number");
            // The module uses the cooperative-matrix instructions (capability CooperativeMatrixKHR = 6022,
            // OpCooperativeMatrixMulAddKHR = 4459), not a fallback.
            let has_op = |opcode: u32| words.iter().any(|&w| w & 0xffff == opcode);
            assert!(words.windows(2).any(|w| w == [0x0002_0011, 6022]), "{}: no OpCapability CooperativeMatrixKHR", kernel.name);
            assert!(has_op(4459), "{}: no OpCooperativeMatrixMulAddKHR", kernel.name);
        }
    }

    /// The cooperative-matrix matmul's workgroup variables are each a multiple of 16 bytes long, so however
    /// a driver packs them each starts 16-byte aligned, as a cooperative load or store needs (NVIDIA's
    /// driver read elements 4 bytes off when a 4-byte variable sat among them; the offsets inside the
    /// arrays, for every variant, are checked by engine/tests/matmul_coop_structure.rs).
    #[test]
    fn matmul_coop_workgroup_variables_keep_16_byte_alignment() {
        for tile in coop_variants() {
            let module = naga::front::wgsl::parse_str(tile.kernel().source).unwrap();
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).unwrap();
            let sizes: Vec<(String, u32)> = module
                .global_variables
                .iter()
                .filter(|(_, v)| v.space == naga::AddressSpace::WorkGroup)
                .map(|(_, v)| (v.name.clone().unwrap_or_default(), layouter[v.ty].size))
                .collect();
            // The staged variants' tiles and slots; a direct variant's slots alone.
            assert_eq!(sizes.len(), if tile.loads == Loads::Direct { 1 } else { 2 }, "{tile}: {sizes:?}");
            for (name, bytes) in &sizes {
                assert!(bytes % 16 == 0, "{tile}: workgroup variable {name} is {bytes} bytes, not a multiple of 16");
            }
            // Together, the bytes the engine checks an adapter for.
            assert_eq!(sizes.iter().map(|(_, b)| b).sum::<u32>(), tile.workgroup_bytes(), "{tile}");
        }
    }

    /// Every kernel and fp32 matmul variant translated to Metal Shading Language and to HLSL by naga, as
    /// wgpu's Metal and DX12 backends translate them, so a kernel that cannot run there fails here.
    /// The cooperative-matrix matmul is left out: wgpu offers cooperative matrices on Vulkan alone (on
    /// Metal and DX12 `--matmul-inputs f16` is refused by feature detection, as on any adapter without them).
    #[test]
    fn every_kernel_translates_to_msl_and_hlsl() {
        let variants: Vec<Kernel> = templated();
        let mut translated = 0;
        for kernel in ALL.iter().chain(&variants) {
            let module = naga::front::wgsl::parse_str(kernel.source).unwrap();
            let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
                .validate(&module)
                .unwrap();
            for entry in &module.entry_points {
                let stage = (naga::ShaderStage::Compute, entry.name.clone());
                let msl_options = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
                let msl_pipeline = naga::back::msl::PipelineOptions { entry_point: Some(stage.clone()), ..Default::default() };
                naga::back::msl::write_string(&module, &info, &msl_options, &msl_pipeline)
                    .unwrap_or_else(|e| panic!("{} ({}) to MSL: {e:?}", kernel.name, entry.name));
                let hlsl_options = naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_0, ..Default::default() };
                let hlsl_pipeline = naga::back::hlsl::PipelineOptions { entry_point: Some(stage) };
                let mut hlsl = String::new();
                naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_options, &hlsl_pipeline)
                    .write(&module, &info, None)
                    .unwrap_or_else(|e| panic!("{} ({}) to HLSL: {e:?}", kernel.name, entry.name));
                assert!(hlsl.contains("numthreads"), "{} ({}): no compute entry point in the HLSL", kernel.name, entry.name);
                translated += 1;
            }
        }
        assert!(translated > ALL.len(), "only {translated} entry points translated");
    }

    #[test]
    fn every_wgsl_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/wgsl");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                continue; // wgsl/common/: helpers prepended to kernels, not kernels
            }
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            // Rendered by MatmulTile, CoopTile and AttentionTile, validated above per variant.
            let templated = [
                "matmul",
                "matmul_coop",
                "matmul_coop_direct",
                "coop_probe",
                "attention_forward",
                "attention_backward",
                "attention_backward_blocked",
                "attention_forward_blocked",
                "attention_decode",
            ]
            .contains(&name.as_str());
            assert!(templated || ALL.iter().any(|k| k.name == name), "wgsl/{name}.wgsl is not in shaders::ALL");
        }
    }
}
