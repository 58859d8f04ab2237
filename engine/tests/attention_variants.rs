//! The training attention kernels' variants (`shaders/src/attention_template.rs`) on the GPU: every
//! variant the adapter can run, and odd row counts that are no candidate (5, 12 and 1 rows, whose
//! blocks straddle key tiles; 4, 12 and 36 for the blocked backward), gives the default variant's bits forward and backward, at awkward sizes
//! (T of no multiple of any tile, head dims of part of a chunk, grouped heads, dropout, an explicit
//! scale), also split across 64 KiB bindings; the default is held to the twin. Decode against a
//! key/value cache, fed in pieces, gives the forward's bits in every variant. Then the tuning table's
//! choice per shape class, and `zerostream tune` / `devices` through the binary.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::kernel_check::tensor;
use common::{assert_close, gpu_or_skip, random};
use zerostream::device::attention_tuning::{AttentionClass, AttentionTable};
use zerostream::device::matmul_tuning::TableSource;
use zerostream::device::{AttentionDims, Backend, DecodeDims, DropoutMask, GpuDevice};
use zerostream::ops::attention as twin;
use zerostream_shaders::{AttentionPass, AttentionTile};

/// (batch, T, H, G, D, dropout p, scale (0: 1/sqrt(D))): a single element; T below, past and between
/// key tiles; D of 1, 7, 16 (part of a 32-channel chunk), 80 (three chunks) and the largest; multi-head,
/// grouped and multi-query; the last, three sequences that 64 KiB bindings split (one per binding).
const CASES: [(usize, usize, usize, usize, usize, f64, f32); 8] = [
    (1, 1, 1, 1, 1, 0.0, 0.0),
    (2, 5, 3, 3, 7, 0.0, 1.0),
    (2, 33, 4, 2, 16, 0.0, 0.0),
    (1, 70, 2, 1, 64, 0.2, 0.0),
    (2, 47, 2, 2, 80, 0.0, 0.0),
    (1, 99, 3, 3, 7, 0.1, 0.3),
    (1, 40, 2, 1, 256, 0.0, 0.0),
    (3, 70, 2, 2, 16, 0.0, 0.0),
];

/// Every case, and those whose sequences fit 64 KiB bindings (attention splits by batch only).
const ALL: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
const SMALL: [usize; 3] = [1, 2, 7];

fn dims(i: usize) -> AttentionDims {
    let (batch, t, h, g, d, p, scale) = CASES[i];
    let dims = AttentionDims::gqa(batch, t, h, g, d).with_dropout(DropoutMask::new(p, 50 + i as u64));
    if scale != 0.0 { dims.with_scale(scale) } else { dims }
}

/// The twin's forward of case `i` and the backward's other inputs: (qkv, out, lse, dout).
fn inputs(i: usize) -> [Vec<f32>; 4] {
    let d = dims(i);
    let rows = d.batch * d.seq_len;
    let qkv = random(200 + i as u64, rows * d.qkv_width(), 1.5);
    let (mut out, mut lse) = (vec![0.0; rows * d.out_width()], vec![0.0; d.stat_len()]);
    twin::attention_forward(&mut out, &mut lse, &qkv, d);
    [qkv, out, lse, random(300 + i as u64, rows * d.out_width(), 1.0)]
}

/// Every case's out and lse, and its dqkv and delta (backward from the twin's forward, written over
/// garbage), named.
fn outputs<D: Backend>(dev: &D, cases: &[usize]) -> Vec<(String, Vec<f32>)> {
    let mut all = Vec::new();
    for &i in cases {
        let (d, [qkv, out, lse, dout]) = (dims(i), inputs(i));
        let tag = format!("{:?}", CASES[i]);
        let (o, l) = (dev.alloc(out.len(), "out").unwrap(), dev.alloc(lse.len(), "lse").unwrap());
        let tqkv = tensor(dev, &qkv);
        dev.attention_forward(&o, &l, &tqkv, d);
        all.push((format!("{tag} out"), dev.read(&o)));
        all.push((format!("{tag} lse"), dev.read(&l)));
        let (dqkv, delta) = (tensor(dev, &random(400, qkv.len(), 9.0)), tensor(dev, &random(401, lse.len(), 9.0)));
        dev.attention_backward(&dqkv, &delta, &tensor(dev, &dout), &tqkv, &tensor(dev, &out), &tensor(dev, &lse), d);
        all.push((format!("{tag} dqkv"), dev.read(&dqkv)));
        all.push((format!("{tag} delta"), dev.read(&delta)));
    }
    all
}

/// The twin's outputs, in `outputs`' order.
fn twin_outputs() -> Vec<(String, Vec<f32>)> {
    let mut all = Vec::new();
    for i in ALL {
        let (d, [qkv, out, lse, dout]) = (dims(i), inputs(i));
        let tag = format!("{:?}", CASES[i]);
        let (mut dqkv, mut delta) = (random(400, qkv.len(), 9.0), random(401, lse.len(), 9.0));
        twin::attention_backward(&mut dqkv, &mut delta, &dout, &qkv, &out, &lse, d);
        all.extend([
            (format!("{tag} out"), out),
            (format!("{tag} lse"), lse),
            (format!("{tag} dqkv"), dqkv),
            (format!("{tag} delta"), delta),
        ]);
    }
    all
}

fn assert_same_bits(label: &str, got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)]) {
    for ((name, g), (_, w)) in got.iter().zip(want) {
        if let Some(i) = g.iter().zip(w).position(|(a, b)| a.to_bits() != b.to_bits()) {
            panic!("{label}: {name}: element {i} is {:e}, the default variant's is {:e}", g[i], w[i]);
        }
    }
}

/// The candidates this adapter runs, then row counts no candidate has (blocks that straddle key tiles).
fn variants(gpu: &GpuDevice) -> Vec<AttentionTile> {
    let mut variants = gpu.attention_variants();
    // Every adapter runs every candidate within WebGPU's default 16 KiB of workgroup memory.
    let everywhere = AttentionTile::CANDIDATES.into_iter().filter(|t| AttentionPass::ALL.iter().all(|p| t.workgroup_bytes(*p) <= 16384));
    for t in everywhere {
        assert!(variants.contains(&t), "{t} does not run on this adapter");
    }
    variants.extend([5, 12, 1].map(AttentionTile::rows));
    // The blocked backward: a block of one group of 4 rows, and one that straddles key tiles.
    variants.extend([4, 12, 36].map(AttentionTile::blocked));
    variants
}

#[test]
fn every_variant_gives_the_default_bits() {
    let Some(gpu) = gpu_or_skip("every_variant_gives_the_default_bits") else { return };
    gpu.force_attention_variant(Some(AttentionTile::DEFAULT)).unwrap();
    let reference = outputs(&gpu, &ALL);
    // The default against the twin, at the kernel tests' tolerance.
    for ((name, g), (_, w)) in reference.iter().zip(&twin_outputs()) {
        assert_close(name, g, w, 1e-4, 1e-4);
    }
    let variants = variants(&gpu);
    for &v in &variants[1..] {
        gpu.force_attention_variant(Some(v)).unwrap();
        assert_same_bits(&v.name(), &outputs(&gpu, &ALL), &reference);
    }
    // Split by batch across small bindings: the same bits too.
    gpu.force_attention_variant(Some(AttentionTile::DEFAULT)).unwrap();
    let reference = outputs(&gpu, &SMALL);
    let mut small = gpu_or_skip("every_variant_gives_the_default_bits").unwrap();
    small.limit_binding_bytes_for_tests(64 << 10);
    for v in [AttentionTile::DEFAULT, AttentionTile::rows(8), AttentionTile::rows(12), AttentionTile::blocked(32)] {
        small.force_attention_variant(Some(v)).unwrap();
        assert_same_bits(&format!("{v} with 64 KiB bindings"), &outputs(&small, &SMALL), &reference);
    }
}

/// Each single-sequence case without dropout fed through `attention_decode` in pieces (a prompt, a row,
/// a row, the rest) into a cache with room to spare: every piece's rows are the forward's, bit for bit,
/// in every variant, also with the new rows split across 64 KiB bindings; the cache holds each row's k
/// and v.
#[test]
fn decode_against_the_cache_gives_the_forward_bits_in_every_variant() {
    let Some(gpu) = gpu_or_skip("decode_against_the_cache_gives_the_forward_bits_in_every_variant") else { return };
    let mut small = gpu_or_skip("decode_against_the_cache_gives_the_forward_bits_in_every_variant").unwrap();
    small.limit_binding_bytes_for_tests(64 << 10);
    for i in [0, 3, 5, 6] {
        let full = AttentionDims { dropout: None, ..dims(i) };
        let t = full.seq_len;
        let qkv = random(500 + i as u64, t * full.qkv_width(), 1.5);
        gpu.force_attention_variant(Some(AttentionTile::DEFAULT)).unwrap();
        let (out, lse) = (gpu.alloc(t * full.out_width(), "out").unwrap(), gpu.alloc(full.stat_len(), "lse").unwrap());
        gpu.attention_forward(&out, &lse, &tensor(&gpu, &qkv), full);
        let want = gpu.read(&out);
        for (dev, v) in variants(&gpu).into_iter().map(|v| (&gpu, v)).chain([(&small, AttentionTile::DEFAULT)]) {
            dev.force_attention_variant(Some(v)).unwrap();
            let capacity = t + 3;
            let cache = tensor(dev, &vec![f32::NAN; capacity * 2 * full.kv_width()]);
            let cuts = [0, t / 3, t / 3 + 1, t / 3 + 2, t].map(|c| c.min(t));
            for w in cuts.windows(2).filter(|w| w[1] > w[0]) {
                let (past, n) = (w[0], w[1] - w[0]);
                let d = DecodeDims::new(AttentionDims { seq_len: n, ..full }, past, capacity);
                let got = dev.alloc(n * full.out_width(), "decode out").unwrap();
                dev.attention_decode(&got, &cache, &tensor(dev, &qkv[past * full.qkv_width()..][..n * full.qkv_width()]), d);
                let label = format!("{:?}, {v}, rows {past}..{}", CASES[i], past + n);
                let rows = vec![(label.clone(), want[past * full.out_width()..][..n * full.out_width()].to_vec())];
                assert_same_bits(&label, &[(label.clone(), dev.read(&got))], &rows);
            }
            let cached = dev.read(&cache);
            for r in 0..t {
                let kv = &qkv[r * full.qkv_width() + full.q_width()..][..2 * full.kv_width()];
                assert_eq!(&cached[r * 2 * full.kv_width()..][..2 * full.kv_width()], kv, "{:?}, {v}: cache row {r}", CASES[i]);
            }
        }
    }
}

#[test]
fn a_variant_the_adapter_cannot_run_is_refused() {
    let Some(gpu) = gpu_or_skip("a_variant_the_adapter_cannot_run_is_refused") else { return };
    for rows in [0, 33] {
        let e = gpu.force_attention_variant(Some(AttentionTile::rows(rows))).unwrap_err().to_string();
        assert!(e.contains(&format!("rows{rows}")), "{e}");
    }
}

#[test]
fn the_table_picks_the_variant_per_shape_class() {
    let Some(gpu) = gpu_or_skip("the_table_picks_the_variant_per_shape_class") else { return };
    let d = AttentionDims::mha(4, 1024, 768, 12);
    let small = AttentionTile::rows(8);
    let class = AttentionClass::of(AttentionPass::Forward, &d);
    gpu.set_attention_table(AttentionTable { source: TableSource::Builtin { vendor: "test" }, entries: BTreeMap::from([(class, small)]) });
    assert_eq!(gpu.attention_variant_for(AttentionPass::Forward, &d), small);
    assert_eq!(gpu.attention_variant_for(AttentionPass::Forward, &AttentionDims { seq_len: 900, ..d }), small, "a nearby T borrows");
    assert_eq!(gpu.attention_variant_for(AttentionPass::Backward, &d), AttentionTile::UNTUNED, "backward is another class");
    let d128 = AttentionDims::gqa(4, 1024, 32, 8, 128);
    assert_eq!(gpu.attention_variant_for(AttentionPass::Forward, &d128), AttentionTile::UNTUNED, "another head dim");
    gpu.force_attention_variant(Some(AttentionTile::rows(16))).unwrap();
    assert_eq!(gpu.attention_variant_for(AttentionPass::Backward, &d), AttentionTile::rows(16), "a forced variant wins");
    // A T whose grid would pass WebGPU's 65535 workgroups with 16 rows each runs the untuned variant's 32.
    let long = AttentionDims { seq_len: 65535 * 16 + 1, ..d };
    assert_eq!(gpu.attention_variant_for(AttentionPass::Backward, &long), AttentionTile::UNTUNED);
    // A blocked variant forced runs both passes.
    gpu.force_attention_variant(Some(AttentionTile::blocked(32))).unwrap();
    assert_eq!(gpu.attention_variant_for(AttentionPass::Backward, &d), AttentionTile::blocked(32));
    assert_eq!(gpu.attention_variant_for(AttentionPass::Forward, &d), AttentionTile::blocked(32));
}

fn zerostream(tune_dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).env("ZEROSTREAM_TUNE_DIR", tune_dir).output().unwrap()
}

/// `tune` times the attention variants forward and backward and writes them beside the matmul's,
/// `devices` shows them; a table from before attention was tuned still loads; a bad name is refused.
#[test]
fn tune_writes_attention_entries_devices_reports_them() {
    if gpu_or_skip("tune_writes_attention_entries_devices_reports_them").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args =
        ["tune", "--quick", "--no-16bit", "--variants", "128x128x8/8x8/db/v4", "--attention-variants", "rows32,rows8,rows32x4", "--json"];
    let out = zerostream(dir.path(), &args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tune failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let attention: Vec<&serde_json::Value> = lines.iter().filter(|l| l["kind"] == "attention_class").collect();
    let classes: Vec<&str> = attention.iter().map(|l| l["class"].as_str().unwrap()).collect();
    // --quick: the tiny GPT-2 (head dim 32) at T = 64.
    assert_eq!(classes, ["forward/d32/t12", "backward/d32/t12"], "{stdout}");
    for l in &attention {
        assert_eq!(l["variants"].as_array().unwrap().len(), 3, "{l}");
        assert!(l["mismatched"].as_array().unwrap().is_empty(), "{l}");
    }
    let summary = lines.last().unwrap();
    assert_eq!(summary["attention_classes"], 2, "{summary}");
    let table = std::path::PathBuf::from(summary["table"].as_str().unwrap());
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&table).unwrap()).unwrap();
    assert_eq!(file["attention"].as_array().unwrap().len(), 2, "{file}");
    let devices = String::from_utf8_lossy(&zerostream(dir.path(), &["devices"]).stdout).into_owned();
    assert!(devices.contains("attention variants: tuned: ") && devices.contains("forward/d32/t12 rows"), "{devices}");
    // The file as an older zerostream wrote it: no attention entries. It loads, attention untuned.
    let mut old = file.clone();
    old.as_object_mut().unwrap().remove("attention");
    std::fs::write(&table, serde_json::to_string(&old).unwrap()).unwrap();
    let devices = zerostream(dir.path(), &["devices"]);
    let text = String::from_utf8_lossy(&devices.stdout);
    assert!(devices.status.success() && !text.contains("warning"), "{text}");
    assert!(
        text.contains(&format!("tuned table {}", table.display())) && text.contains("attention variants: rows32x4 for every shape"),
        "{text}"
    );
    let bad = zerostream(dir.path(), &["tune", "--quick", "--attention-variants", "rows40"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("rows40") && stderr.contains("1 to 32"), "{stderr}");
}
