use super::*;
use crate::ops::Operand;

#[test]
fn classes_name_layouts_and_buckets_reversibly() {
    let forward = MatmulShape::row_major(4096, 2304, 768);
    let c = MatmulClass::of(&forward, false);
    assert_eq!(c.key(), "nn/f32/m24/n22/k19");
    assert_eq!(MatmulClass::parse(&c.key()), Some(c));
    let dw =
        MatmulShape { m: 768, n: 2304, k: 4096, a: Operand::transposed(768), b: Operand::row_major(2304), c: Operand::row_major(2304) };
    assert_eq!(MatmulClass::of(&dw, true).key(), "tn/b16/m19/n22/k24");
    assert_eq!(MatmulClass::parse("xn/f32/m1/n1/k1"), None);
    assert_eq!(MatmulClass::parse("nn/f32/m1/n1"), None);
}

/// An adapter summary of `vendor` with the smallest limits.
fn adapter(vendor: u32) -> AdapterSummary {
    AdapterSummary {
        index: 0,
        name: "test".into(),
        backend: "Vulkan".into(),
        device_type: wgpu::DeviceType::DiscreteGpu,
        driver: String::new(),
        vendor,
        max_storage_binding_bytes: 128 << 20,
        max_buffer_bytes: 256 << 20,
        max_workgroup_storage_bytes: 16 << 10,
        max_invocations_per_workgroup: 256,
        shader_f16: false,
        timestamp_query: false,
        subgroup: false,
        cooperative_matrix: false,
        cooperative_matrix_configs: Vec::new(),
    }
}

/// NVIDIA's built-in default is the variant that won most classes on an H100, a candidate within the
/// smallest limits; an adapter of a vendor nobody measured keeps the kernel as it was.
#[test]
fn the_builtin_default_is_the_measured_one_for_nvidia_alone() {
    let (vendor, nvidia) = builtin_default(&adapter(0x10de));
    assert_eq!((vendor, nvidia.name().as_str()), ("NVIDIA", "64x64x16/4x4/db/v4"));
    assert!(MatmulTile::CANDIDATES.contains(&nvidia) && nvidia.workgroup_bytes() <= 16 << 10 && nvidia.workgroup_size() <= 256);
    for other in [0x1002, 0x8086, 0x106b, 0x10005] {
        assert_eq!(builtin_default(&adapter(other)).1, MatmulTile::DEFAULT);
    }
}

/// A tuned table keeps the vendor's default for the classes it does not name (`zerostream tune`
/// writes it so), not the kernel's original one.
#[test]
fn a_tuned_table_defaults_to_the_vendors_variant() {
    let nvidia = TableFile::for_adapter(&adapter(0x10de), "now".into(), Vec::new(), Vec::new(), Vec::new());
    assert_eq!(nvidia.default, "64x64x16/4x4/db/v4");
    assert_eq!(nvidia.key, TableKey::of(&adapter(0x10de)));
    let amd = TableFile::for_adapter(&adapter(0x1002), "now".into(), Vec::new(), Vec::new(), Vec::new());
    assert_eq!(amd.default, MatmulTile::DEFAULT.name());
}

#[test]
fn choose_prefers_own_then_near_then_default() {
    let own = MatmulClass::parse("nn/f32/m24/n22/k19").unwrap();
    let near = MatmulClass::parse("nn/f32/m24/n23/k19").unwrap();
    let far = MatmulClass::parse("nn/f32/m18/n14/k19").unwrap();
    let other_layout = MatmulClass::parse("nt/f32/m24/n22/k19").unwrap();
    let small = MatmulTile::parse("64x64x8/8x8/db/v4").unwrap();
    let mut table = MatmulTable {
        source: TableSource::Builtin { vendor: "test" },
        default: MatmulTile::DEFAULT,
        entries: BTreeMap::from([(own, small)]),
        coop_entries: BTreeMap::new(),
        coop_default: None,
        upload_staging: UploadStaging::Mapped,
        read_back: ReadBack::Mapped,
    };
    assert_eq!(table.choose(&own), small);
    assert_eq!(table.choose(&near), small);
    assert_eq!(table.choose(&far), MatmulTile::DEFAULT);
    assert_eq!(table.choose(&other_layout), MatmulTile::DEFAULT);
    table.entries.insert(near, MatmulTile::CANDIDATES[1]);
    assert_eq!(table.choose(&near), MatmulTile::CANDIDATES[1]);
    assert_eq!(table.choose(&own), small);
    // The cooperative-matrix entries alike, and only of the adapter's cooperative size.
    let coop = CoopTile::candidates(16)[2];
    table.coop_entries.insert(own, coop);
    assert_eq!(table.choose_coop(&near, 16), coop);
    assert_eq!(table.choose_coop(&far, 16), CoopTile::default_for(16));
    assert_eq!(table.choose_coop(&own, 8), CoopTile::default_for(8));
    // An entry of the other size, nearer, does not hide one of the adapter's size.
    table.coop_entries.insert(near, CoopTile::candidates(8)[1]);
    assert_eq!(table.choose_coop(&near, 16), coop);
    assert_eq!(table.choose_coop(&near, 8), CoopTile::candidates(8)[1]);
    // A vendor's measured default stands in for the untuned classes of its size alone.
    table.coop_default = builtin_coop_default(&adapter(0x10de));
    assert_eq!(table.choose_coop(&far, 16).name(), "c16/128x128x32/4x4/128/ws");
    assert_eq!(table.choose_coop(&far, 8), CoopTile::default_for(8));
    assert_eq!(table.choose_coop(&own, 16), coop);
    assert!(CoopTile::candidates(16).contains(&table.coop_default_for(16)));
    assert_eq!(builtin_coop_default(&adapter(0x1002)), None);
}
