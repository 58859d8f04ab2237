//! The GPU adapters wgpu finds and what zerostream needs to know of each ([`AdapterSummary`]: name,
//! driver, limits, optional features, cooperative-matrix configurations): what `zerostream devices`
//! prints, what the gpu device opens, and what the tuning tables are keyed by.

use std::path::Path;

/// What `zerostream devices` prints about one adapter.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: wgpu::DeviceType,
    pub driver: String,
    /// The PCI vendor id (0x10de NVIDIA, 0x1002 AMD, 0x8086 Intel, 0x106b Apple; Mesa's software 0x10005).
    pub vendor: u32,
    pub max_storage_binding_bytes: u64,
    pub max_buffer_bytes: u64,
    pub max_workgroup_storage_bytes: u32,
    pub max_invocations_per_workgroup: u32,
    pub shader_f16: bool,
    pub timestamp_query: bool,
    pub subgroup: bool,
    /// Whether wgpu offers `EXPERIMENTAL_COOPERATIVE_MATRIX` on this adapter.
    pub cooperative_matrix: bool,
    /// The cooperative-matrix configurations the adapter lists (M x N x K, input and accumulator types).
    pub cooperative_matrix_configs: Vec<CoopMatrixConfig>,
}

impl AdapterSummary {
    pub(super) fn new(index: usize, adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let features = adapter.features();
        AdapterSummary {
            index,
            name: info.name,
            backend: format!("{:?}", info.backend),
            device_type: info.device_type,
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            vendor: info.vendor,
            max_storage_binding_bytes: limits.max_storage_buffer_binding_size,
            max_buffer_bytes: limits.max_buffer_size,
            max_workgroup_storage_bytes: limits.max_compute_workgroup_storage_size,
            max_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroup: features.contains(wgpu::Features::SUBGROUP),
            cooperative_matrix: features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            cooperative_matrix_configs: adapter.cooperative_matrix_properties().iter().map(CoopMatrixConfig::new).collect(),
        }
    }

    /// The cooperative size matmul_coop.wgsl would multiply with here: the largest COOP of the
    /// COOP x COOP x COOP f16 -> f32 configurations the adapter lists (16 on NVIDIA, 8 on Mesa's lavapipe).
    pub fn coop_f16_size(&self) -> Option<u32> {
        self.cooperative_matrix_configs.iter().filter_map(CoopMatrixConfig::coop_f16_size).max()
    }

    /// A hardware GPU (discrete, integrated or virtualised), as opposed to a software rasteriser.
    pub fn is_real_gpu(&self) -> bool {
        matches!(self.device_type, wgpu::DeviceType::DiscreteGpu | wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::VirtualGpu)
    }

    /// The order `--device gpu` prefers adapters in: discrete first, software last.
    pub(super) fn preference(&self) -> u8 {
        match self.device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Cpu => 3,
            wgpu::DeviceType::Other => 4,
        }
    }
}

/// Keeps Mesa's Vulkan device-select layer quiet on a machine without a desktop session.
///
/// wgpu enables every window-system extension the driver offers (it cannot know that zerostream never
/// draws), and with `VK_KHR_wayland_surface` enabled, Mesa's implicit `VK_LAYER_MESA_device_select` asks
/// the Wayland compositor which GPU is the default one. Without `XDG_RUNTIME_DIR` libwayland prints
/// `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` to stderr and the question fails
/// (there is no compositor to ask). When the variable is unset (or not an absolute path) this sets it,
/// for this process and its children only, to the temporary directory, where no compositor socket
/// exists: the question then fails silently. `DRI_PRIME`, `MESA_VK_DEVICE_SELECT` and a real session's
/// variable are left alone, so the layer still does what a user asked of it.
///
/// # Safety
/// Changes the environment: call it before any other thread of the process is started (the binary
/// does, first thing in `main`), as [`std::env::set_var`] requires.
pub unsafe fn quiet_wayland_probe() {
    let set = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| Path::new(&d).is_absolute());
    if !set {
        // SAFETY: the caller guarantees no other thread reads or writes the environment now.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}

pub(super) fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle())
}

pub(super) fn adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
}

/// Every adapter wgpu finds, in its order (the index `--adapter` takes).
pub fn list_adapters() -> Vec<AdapterSummary> {
    adapters(&instance()).iter().enumerate().map(|(i, a)| AdapterSummary::new(i, a)).collect()
}

/// The index of the adapter `--device gpu` opens without `--adapter`: the most capable (discrete
/// first, software last; the lowest index among equals). `None` without adapters.
pub fn preferred_adapter(summaries: &[AdapterSummary]) -> Option<usize> {
    summaries.iter().min_by_key(|s| (s.preference(), s.index)).map(|s| s.index)
}

/// One cooperative-matrix configuration an adapter lists: C (M x N) += A (M x K) @ B (K x N).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopMatrixConfig {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Element type of A and B ("f16", "f32", "i32", "u32").
    pub ab_type: &'static str,
    /// Element type of C and the result.
    pub cr_type: &'static str,
}

impl CoopMatrixConfig {
    fn new(p: &wgpu::CooperativeMatrixProperties) -> Self {
        let name = |t: wgpu::CooperativeScalarType| match t {
            wgpu::CooperativeScalarType::F32 => "f32",
            wgpu::CooperativeScalarType::F16 => "f16",
            wgpu::CooperativeScalarType::I32 => "i32",
            wgpu::CooperativeScalarType::U32 => "u32",
        };
        CoopMatrixConfig { m: p.m_size, n: p.n_size, k: p.k_size, ab_type: name(p.ab_type), cr_type: name(p.cr_type) }
    }

    /// The size of a configuration matmul_coop.wgsl can multiply with: COOP x COOP x COOP, f16 inputs,
    /// f32 accumulator, COOP 8 or 16.
    pub fn coop_f16_size(&self) -> Option<u32> {
        let square = self.m == self.n && self.n == self.k && [8, 16].contains(&self.m);
        (square && (self.ab_type, self.cr_type) == ("f16", "f32")).then_some(self.m)
    }
}

impl std::fmt::Display for CoopMatrixConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{} {}->{}", self.m, self.n, self.k, self.ab_type, self.cr_type)
    }
}
