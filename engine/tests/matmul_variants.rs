//! The fp32 matmul's variants (`shaders/src/matmul_template.rs`) on the GPU: every variant the adapter
//! can run gives the default variant's bits, in every operand layout, with a bias and accumulating, with
//! a 16-bit B, and with products split across 64 KiB bindings; the default is held to the twin. Then
//! the tuning table's choice per shape class, and `zerostream tune` / `devices` through the binary.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::kernel_check::tensor;
use common::{assert_close, gpu_or_skip, random};
use zerostream::device::matmul_tuning::{MatmulClass, MatmulTable, TableSource};
use zerostream::device::{Backend, CpuDevice, HalfFormat, MatmulShape, Operand};
use zerostream_shaders::MatmulTile;

/// Shapes at every kind of tile edge for 32..128-wide tiles and K steps of 8 and 16.
const SHAPES: [(usize, usize, usize); 7] =
    [(1, 1, 1), (3, 17, 9), (63, 65, 17), (65, 130, 33), (129, 33, 130), (130, 200, 96), (7, 33, 1031)];

/// Every layout of A and B, with and without bias and accumulation, a strided C, and a 16-bit B.
fn products<D: Backend>(dev: &D) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        let seed = 1000 + 10 * i as u64;
        let (a, b, bias, c0) =
            (random(seed, m * k, 1.0), random(seed + 1, k * n + 1, 1.0), random(seed + 2, n, 1.0), random(seed + 3, m * (n + 2), 1.0));
        let (ta, tb, tbias) = (tensor(dev, &a), tensor(dev, &b), tensor(dev, &bias));
        for (layout, a_op, b_op) in [
            ("nn", Operand::row_major(k), Operand::row_major(n)),
            ("tn", Operand::transposed(m), Operand::row_major(n)),
            ("nt", Operand::row_major(k), Operand::transposed(k)),
            ("tt", Operand::transposed(m), Operand::transposed(k)),
        ] {
            for (with_bias, accumulate) in [(true, false), (false, true)] {
                let c = tensor(dev, &c0);
                let shape = MatmulShape { m, n, k, a: a_op, b: b_op, c: Operand { offset: 1, row_stride: n + 2, col_stride: 1 } };
                dev.matmul(&c, &ta, &tb, with_bias.then_some(&tbias), &shape, accumulate);
                out.push((format!("{m}x{n}x{k} {layout} bias={with_bias} accumulate={accumulate}"), dev.read(&c)));
            }
        }
        // B as bf16 at an odd offset (packed words split), forward and transposed.
        let bits: Vec<u16> = b.iter().map(|x| half::bf16::from_f32(*x).to_bits()).collect();
        let tb16 = dev.alloc_16bit(bits.len(), "b16", HalfFormat::Bf16).unwrap();
        dev.write_16bit(&tb16, &bits, HalfFormat::Bf16).unwrap();
        for (layout, b_op) in
            [("nn", Operand { offset: 1, row_stride: n, col_stride: 1 }), ("nt", Operand { offset: 1, row_stride: 1, col_stride: k })]
        {
            let c = dev.alloc(m * n, "c").unwrap();
            let shape = MatmulShape { m, n, k, a: Operand::row_major(k), b: b_op, c: Operand::row_major(n) };
            dev.matmul(&c, &ta, &tb16, None, &shape, false);
            out.push((format!("{m}x{n}x{k} {layout} bf16 B"), dev.read(&c)));
        }
    }
    out
}

fn bits(outputs: &[(String, Vec<f32>)]) -> Vec<Vec<u32>> {
    outputs.iter().map(|(_, v)| v.iter().map(|x| x.to_bits()).collect()).collect()
}

fn assert_same_bits(label: &str, got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)]) {
    for ((name, g), w) in got.iter().zip(bits(want)) {
        let g: Vec<u32> = g.iter().map(|x| x.to_bits()).collect();
        if let Some(i) = g.iter().zip(&w).position(|(a, b)| a != b) {
            panic!("{label}: {name}: element {i} is {:e}, the default variant's is {:e}", f32::from_bits(g[i]), f32::from_bits(w[i]));
        }
    }
}

#[test]
fn every_variant_gives_the_default_bits() {
    let Some(gpu) = gpu_or_skip("every_variant_gives_the_default_bits") else { return };
    let variants = gpu.matmul_variants();
    assert!(variants.len() >= 6, "lavapipe and every real GPU run most candidates: {variants:?}");
    gpu.force_matmul_variant(Some(MatmulTile::DEFAULT)).unwrap();
    let reference = products(&gpu);
    // The default against the twin (the cpu device), at the kernel tests' tolerance.
    let twin = products(&CpuDevice::new(None));
    for ((name, g), (_, w)) in reference.iter().zip(&twin) {
        assert_close(name, g, w, 1e-4, 1e-4);
    }
    for &v in &variants[1..] {
        gpu.force_matmul_variant(Some(v)).unwrap();
        assert_same_bits(&v.name(), &products(&gpu), &reference);
    }
    // Products split across small bindings (K halves accumulate) give the same bits too: the default,
    // the smallest tile (the most workgroups per split) and every variant with scalar loads.
    let mut small = gpu_or_skip("every_variant_gives_the_default_bits").unwrap();
    small.limit_binding_bytes_for_tests(64 << 10);
    let smallest = *variants.iter().min_by_key(|v| v.tile_m * v.tile_n).unwrap();
    let scalar_loads = variants.iter().filter(|v| !v.vector_loads);
    for &v in [MatmulTile::DEFAULT, smallest].iter().chain(scalar_loads) {
        small.force_matmul_variant(Some(v)).unwrap();
        assert_same_bits(&format!("{v} with 64 KiB bindings"), &products(&small), &reference);
    }
}

#[test]
fn a_variant_the_adapter_cannot_run_is_refused() {
    let Some(gpu) = gpu_or_skip("a_variant_the_adapter_cannot_run_is_refused") else { return };
    let big = MatmulTile { tile_k: 64, ..MatmulTile::DEFAULT }; // 128 KiB of workgroup memory
    assert!(big.check().is_ok());
    let e = gpu.force_matmul_variant(Some(big)).unwrap_err().to_string();
    assert!(e.contains(&big.name()), "{e}");
}

#[test]
fn the_table_picks_the_variant_per_shape_class() {
    let Some(gpu) = gpu_or_skip("the_table_picks_the_variant_per_shape_class") else { return };
    let shape = MatmulShape::row_major(4096, 2304, 768);
    let small = MatmulTile::parse("64x64x8/8x8/db/v4").unwrap();
    let class = MatmulClass::of(&shape, false);
    // Where the adapter has cooperative matrices, its size's third variant for the class.
    let coop = gpu.coop_variants().get(2).copied();
    gpu.set_matmul_table(MatmulTable {
        source: TableSource::Builtin { vendor: "test" },
        default: MatmulTile::DEFAULT,
        entries: BTreeMap::from([(class, small)]),
        coop_entries: coop.map(|t| (class, t)).into_iter().collect(),
        coop_default: None,
        upload_staging: zerostream::device::UploadStaging::Mapped,
        read_back: zerostream::device::ReadBack::Mapped,
    });
    if let Some(coop) = coop {
        assert_eq!(gpu.coop_variant_for(&shape, false), Some(coop));
        assert_eq!(gpu.coop_variant_for(&shape, true), Some(gpu.coop_variants()[0]), "16-bit B is another class");
        gpu.force_coop_variant(Some(gpu.coop_variants()[1])).unwrap();
        assert_eq!(gpu.coop_variant_for(&shape, false), Some(gpu.coop_variants()[1]), "a forced variant wins");
        gpu.force_coop_variant(None).unwrap();
    } else {
        assert_eq!(gpu.coop_variant_for(&shape, false), None);
    }
    assert_eq!(gpu.matmul_variant_for(&shape, false), small);
    assert_eq!(gpu.matmul_variant_for(&shape, true), MatmulTile::DEFAULT, "16-bit B is another class");
    let dw =
        MatmulShape { m: 768, n: 2304, k: 4096, a: Operand::transposed(768), b: Operand::row_major(2304), c: Operand::row_major(2304) };
    assert_eq!(gpu.matmul_variant_for(&dw, false), MatmulTile::DEFAULT, "another layout is another class");
    gpu.force_matmul_variant(Some(MatmulTile::CANDIDATES[1])).unwrap();
    assert_eq!(gpu.matmul_variant_for(&shape, false), MatmulTile::CANDIDATES[1], "a forced variant wins");
}

fn zerostream(tune_dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).env("ZEROSTREAM_TUNE_DIR", tune_dir).output().unwrap()
}

/// `tune` writes the table where the device looks (ZEROSTREAM_TUNE_DIR here), `devices` names it, a
/// corrupt table is reported and not used, and a bad variant name is refused by name.
#[test]
fn tune_writes_the_table_devices_reports_it() {
    let Some(gpu) = gpu_or_skip("tune_writes_the_table_devices_reports_it") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = zerostream(dir.path(), &["tune", "--quick", "--no-16bit", "--variants", "128x128x8/8x8/db/v4,64x64x8/8x8/db/v4", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tune failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["kind"], "summary");
    assert!(summary["classes"].as_u64().unwrap() >= 10, "{summary}");
    // The upload staging first: both kinds timed where the adapter has them (lavapipe does), the
    // faster kept in the table.
    let upload = &lines[0];
    assert_eq!(upload["kind"], "upload", "{upload}");
    assert!(upload["mapped_gbps"].as_f64().unwrap() > 0.0, "{upload}");
    assert_eq!(upload["host_gbps"].is_null(), gpu.host_staging_unavailable().is_some(), "{upload}");
    // Then the read-back: mapped buffers against pinned host memory, the faster kept.
    let download = &lines[1];
    assert_eq!(download["kind"], "download", "{download}");
    assert!(download["mapped_gbps"].as_f64().unwrap() > 0.0, "{download}");
    assert_eq!(download["pinned_gbps"].is_null(), gpu.host_staging_unavailable().is_some(), "{download}");
    // The matmul's classes, then the attention kernels' (attention_variants.rs checks those).
    let classes: Vec<_> = lines[2..lines.len() - 1].iter().filter(|l| l["kind"] != "attention_class").collect();
    // The two asked for, and the vendor's default first where it is neither (NVIDIA's): the baseline.
    let vendor_default = MatmulTable::builtin(gpu.summary()).default.name();
    let asked = ["128x128x8/8x8/db/v4", "64x64x8/8x8/db/v4"];
    let per_class = 2 + !asked.contains(&vendor_default.as_str()) as usize;
    assert!(classes.iter().all(|l| l["kind"] == "class" && l["variants"].as_array().unwrap().len() == per_class), "{classes:?}");
    assert!(classes.iter().all(|l| l["variants"][0]["variant"] == vendor_default.as_str()), "the baseline first");
    // Where the time went, per class and in the summary's sum.
    let spent = |l: &serde_json::Value, part: &str| l["spent"][part].as_f64().unwrap_or(-1.0);
    assert!(classes.iter().all(|l| spent(l, "setup_s") >= 0.0 && spent(l, "check_s") > 0.0 && spent(l, "timing_s") > 0.0), "{classes:?}");
    let timing_s: f64 = classes.iter().map(|l| spent(l, "timing_s")).sum();
    assert!((summary["spent"]["matmul"]["timing_s"].as_f64().unwrap() - timing_s).abs() < 1e-9, "{summary}");
    let table = std::path::PathBuf::from(summary["table"].as_str().unwrap());
    assert!(table.starts_with(dir.path()) && table.exists());
    // Classes the table does not name keep the vendor's built-in default.
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert_eq!(saved["default"].as_str(), Some(vendor_default.as_str()), "the table's default");
    assert_eq!(saved["upload"]["staging"], upload["chosen"], "the upload staging kept is the one tune chose");
    assert_eq!(saved["download"]["read_back"], download["chosen"], "the read-back kept is the one tune chose");
    // Out of time before the first variant: nothing timed, nothing the table holds lost.
    let none = zerostream(dir.path(), &["tune", "--quick", "--no-16bit", "--max-seconds", "0", "--json"]);
    let none_stdout = String::from_utf8_lossy(&none.stdout);
    assert!(none.status.success(), "tune --max-seconds 0: {}", String::from_utf8_lossy(&none.stderr));
    let none_summary: serde_json::Value = serde_json::from_str(none_stdout.lines().last().unwrap()).unwrap();
    assert_eq!((none_summary["classes"].as_u64(), none_summary["attention_classes"].as_u64()), (Some(0), Some(0)), "{none_stdout}");
    let kept: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert_eq!(kept["entries"], saved["entries"], "the tuned classes survive a tune that timed none");
    assert!(saved["entries"].as_array().is_some_and(|e| !e.is_empty()));
    let devices = String::from_utf8_lossy(&zerostream(dir.path(), &["devices"]).stdout).into_owned();
    assert!(devices.contains(&format!("tuned table {}", table.display())), "{devices}");
    let read_back = if download["chosen"] == "pinned" { "read-back: pinned host memory" } else { "read-back: wgpu's mapped buffers" };
    assert!(devices.contains(read_back), "devices names the read-back tune kept: {devices}");
    // A table copied in under another name (from a machine like this one, say) is found by its key.
    let copied = dir.path().join("copied-from-elsewhere.json");
    std::fs::rename(&table, &copied).unwrap();
    let devices = String::from_utf8_lossy(&zerostream(dir.path(), &["devices"]).stdout).into_owned();
    assert!(devices.contains(&format!("tuned table {}", copied.display())), "{devices}");
    std::fs::rename(&copied, &table).unwrap();
    std::fs::write(&table, "{ not json").unwrap();
    let devices = zerostream(dir.path(), &["devices"]);
    let text = String::from_utf8_lossy(&devices.stdout);
    assert!(devices.status.success() && text.contains("built-in default") && text.contains("ignoring the matmul tuning table"), "{text}");
    // A table place it could not write is refused before anything is timed.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let out = zerostream(&file, &["tune", "--quick", "--no-16bit", "--variants", "128x128x8/8x8/db/v4", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot create it") && err.contains("--no-save"), "{err}");
    assert!(out.stdout.is_empty(), "no class was timed: {}", String::from_utf8_lossy(&out.stdout));
    let bad = zerostream(dir.path(), &["tune", "--quick", "--variants", "128x128x7/8x8/db/v4"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("128x128x7/8x8/db/v4") && stderr.contains("multiple of 4"), "{stderr}");
}
