//! `zerostream selftest`: it passes on the cpu device and on the GPU adapter here (lavapipe in CI), it
//! covers every op, a wrong number, an error, a panic and a wgpu error each fail their check (naming the
//! case) without stopping the rest, and the command's exit code, last line and JSON are what scripts
//! read. The library runs are the full ones the command runs (a few seconds on lavapipe in a debug
//! build); the command's are quick ones.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{gpu_or_skip, random};
use zerostream::device::{AnyDevice, Backend, CpuDevice, GpuDevice, MatmulShape};
use zerostream::selftest::{self, Check, CheckResult, Report, Size, Tolerance};

/// The results every device reports, whatever its kind: one per op of the `Backend` trait that has a kernel.
const EVERY_DEVICE: [&str; 35] = [
    "matmul",
    "matmul 16-bit B",
    "bias_backward",
    "attention_forward",
    "attention_backward",
    "attention_decode",
    "layernorm_forward",
    "layernorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "gelu_tanh_forward",
    "gelu_tanh_backward",
    "gelu_erf_forward",
    "gelu_erf_backward",
    "relu_forward",
    "relu_backward",
    "swiglu_forward",
    "swiglu_backward",
    "rope",
    "rope_at",
    "encoder_forward",
    "encoder_backward",
    "crossentropy",
    "crossentropy_chunk_stats",
    "crossentropy_chunk_grad",
    "dropout",
    "dropout_residual",
    "residual_forward",
    "axpy",
    "fill",
    "sum_squares",
    "cast_half_to_f32",
    "matmul_f16_inputs",
    "matmul_f16_inputs input rounding",
    "cast_f32_to_f16",
];

/// Runs the full self-test and fails, with every failing line, unless everything passed.
fn passes(dev: &AnyDevice) -> Report {
    let report = selftest::run(dev, Size::Full, &mut |_| {});
    let failures: Vec<String> = report.results.iter().filter(|r| !r.passed()).map(CheckResult::line).collect();
    assert!(failures.is_empty(), "selftest on {}:\n{}", report.device, failures.join("\n"));
    assert_eq!(report.summary_line(), format!("selftest: {} passed, 0 failed", report.results.len()));
    for r in &report.results {
        println!("{}", r.line());
    }
    println!("{} in {:.1} s", report.summary_line(), report.seconds);
    report
}

fn kernels(report: &Report) -> BTreeSet<&str> {
    report.results.iter().map(|r| r.kernel.as_str()).collect()
}

#[test]
fn the_cpu_devices_fast_kernels_pass_against_the_twins() {
    let report = passes(&AnyDevice::Cpu(CpuDevice::new(None)));
    let names = kernels(&report);
    let cpu = EVERY_DEVICE.iter().filter(|k| !k.starts_with("cast_f32_to_f16"));
    let missing: Vec<_> = cpu.filter(|k| !names.contains(*k)).collect();
    assert!(missing.is_empty(), "not checked on the cpu device: {missing:?}");
    assert!(report.lacks.is_empty() && report.not_checked.is_empty());
}

#[test]
fn the_gpu_kernels_pass_against_the_twins() {
    let Some(gpu) = gpu_or_skip("the_gpu_kernels_pass_against_the_twins") else { return };
    let coop = gpu.has_coop_matmul();
    let coop_variants: Vec<_> = gpu.coop_variants().into_iter().skip(1).collect();
    assert_eq!(coop, !coop_variants.is_empty());
    let report = passes(&AnyDevice::Gpu(gpu));
    let names = kernels(&report);
    let expected: Vec<String> = EVERY_DEVICE
        .iter()
        .map(|k| k.replace("matmul_f16_inputs", "matmul_coop"))
        .filter(|k| coop || !k.starts_with("matmul_coop"))
        .collect();
    // Again with 64 KiB bindings: all but the training attention (it splits by sequence only) and the cast.
    let split =
        expected.iter().filter(|k| !k.starts_with("attention_forward") && !k.starts_with("attention_backward") && *k != "cast_f32_to_f16");
    let split: Vec<String> = split.map(|k| format!("{k} (64 KiB bindings)")).collect();
    // Every cooperative-matrix variant besides the default (run in full above), against the twin and its bits.
    let variants = coop_variants.iter().flat_map(|v| [format!("matmul_coop {v}"), format!("matmul_coop {v} = c{}'s default", v.coop)]);
    let variants: Vec<String> = variants.collect();
    let missing: Vec<&String> = expected.iter().chain(&split).chain(&variants).filter(|k| !names.contains(k.as_str())).collect();
    assert!(missing.is_empty(), "not checked on the gpu: {missing:?}");
    assert!(names.contains("compile"), "{names:?}");
    // An adapter without the cooperative matrices says so, by kernel.
    assert_eq!(report.not_checked.iter().any(|n| n.kernel == "matmul_coop"), !coop, "{:?}", report.not_checked);
}

/// A matmul on `dev` compared with the twin, one element of the device's result moved by `moved`.
fn perturbed_matmul<D: Backend>(dev: &D, moved: f32) -> anyhow::Result<Vec<CheckResult>> {
    let (m, n, k) = (3, 5, 7);
    let (a, b) = (random(1, m * k, 1.0), random(2, k * n, 1.0));
    let c = dev.alloc(m * n, "c")?;
    let (ta, tb) = (dev.alloc(a.len(), "a")?, dev.alloc(b.len(), "b")?);
    dev.write(&ta, &a);
    dev.write(&tb, &b);
    let shape = MatmulShape::row_major(m, n, k);
    dev.matmul(&c, &ta, &tb, None, &shape, false);
    let mut want = vec![0.0; m * n];
    zerostream::ops::matmul::matmul(&mut want, &a, &b, None, &shape, false);
    let mut check = Check::new("matmul (perturbed)", Tolerance::close(1e-4, 1e-4));
    check.compare("3x5x7 untouched", &dev.read(&c), &want);
    let mut got = dev.read(&c);
    got[11] += moved;
    check.compare("3x5x7 with element 11 moved", &got, &want);
    Ok(vec![check.finish()])
}

#[test]
fn a_wrong_result_an_error_and_a_panic_each_fail_their_check_by_name() {
    let dev = CpuDevice::new(None);
    let [r] = &selftest::guarded(&dev, "matmul", |d| perturbed_matmul(d, 1e-2))[..] else { panic!("one result") };
    assert!(!r.passed() && (r.cases, r.failed_cases) == (2, 1), "{}", r.line());
    let line = r.line();
    println!("{line}");
    assert!(line.starts_with("FAIL  matmul (perturbed)") && line.contains("1 of 2 cases"), "{line}");
    assert!(line.contains("case \"3x5x7 with element 11 moved\" [11]"), "{line}");
    // Within the tolerance it passes.
    assert!(selftest::guarded(&dev, "matmul", |d| perturbed_matmul(d, 1e-6))[0].passed());
    let err = selftest::guarded(&dev, "refused", |_: &CpuDevice| anyhow::bail!("no such thing"));
    assert_eq!((err[0].kernel.as_str(), err[0].error.as_deref(), err[0].passed()), ("refused", Some("no such thing"), false));
    let panicked =
        selftest::guarded(&dev, "panics", |_: &CpuDevice| -> anyhow::Result<Vec<CheckResult>> { panic!("index 7 out of range") });
    assert_eq!(panicked[0].error.as_deref(), Some("panicked: index 7 out of range"));
    assert!(panicked[0].line().starts_with("FAIL  panics"), "{}", panicked[0].line());
}

/// A wgpu error (here a write past a buffer's end) fails the check it happened in instead of ending the
/// process; a kernel the adapter cannot compile is refused in words; the device works on afterwards.
#[test]
fn wgpu_errors_fail_their_check_and_the_device_works_on() {
    let Some(gpu) = gpu_or_skip("wgpu_errors_fail_their_check_and_the_device_works_on") else { return };
    let results = selftest::guarded(&gpu, "write past the end", |d: &GpuDevice| {
        let t = d.upload_words(&[0; 4], "four words")?;
        d.write_words(&t, &[1; 8]);
        perturbed_matmul(d, 0.0)
    });
    let error = results[0].error.as_deref().unwrap_or_default();
    assert!(!results[0].passed() && error.starts_with("the device reported: "), "{}", results[0].line());
    assert!(!error.contains('\n'), "{error}");
    let coop_size = gpu.summary().coop_f16_size().unwrap_or(16);
    let coop = gpu.compile(zerostream_shaders::CoopTile::default_for(coop_size).kernel());
    assert_eq!(coop.is_ok(), gpu.has_coop_matmul(), "{coop:?}");
    if let Err(e) = coop {
        println!("matmul_coop on {}: {e}", gpu.summary().name);
        assert!(!e.is_empty() && !e.contains('\n'));
    }
    assert_eq!(gpu.compile(zerostream_shaders::MatmulTile::DEFAULT.kernel()), Ok(1));
    let after = selftest::guarded(&gpu, "matmul", |d| selftest::check_matmul(d, "matmul after the errors", Size::Quick));
    assert!(after.iter().all(CheckResult::passed), "{:?}", after.iter().map(CheckResult::line).collect::<Vec<_>>());
}

fn zerostream(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zerostream")).args(args).output().expect("running zerostream")
}

fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes).lines().map(str::to_string).collect()
}

#[test]
fn the_command_says_what_passed_and_exits_0_or_1() {
    let out = zerostream(&["selftest", "--device", "cpu", "--quick"]);
    let (stdout, stderr) = (lines(&out.stdout), String::from_utf8_lossy(&out.stderr).into_owned());
    assert_eq!(out.status.code(), Some(0), "{stdout:#?}\n{stderr}");
    let passes = stdout.iter().filter(|l| l.starts_with("PASS  ")).count();
    assert!(passes >= 30 && !stdout.iter().any(|l| l.starts_with("FAIL")), "{stdout:#?}");
    assert!(stdout[0].starts_with("selftest on cpu ("), "{stdout:#?}");
    assert_eq!(stdout.last().unwrap(), &format!("selftest: {passes} passed, 0 failed"));
    // A check that outlives --check-timeout is failed by name and the run stops: exit code 1.
    let out = zerostream(&["selftest", "--device", "cpu", "--quick", "--check-timeout", "0.001"]);
    let stdout = lines(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout:#?}");
    let fail = stdout.iter().find(|l| l.starts_with("FAIL")).expect("a FAIL line");
    assert!(fail.contains("did not finish within 0.001 s: too slow for --check-timeout"), "the cpu device is no adapter: {fail}");
    assert!(stdout.last().unwrap().starts_with("selftest: ") && stdout.last().unwrap().ends_with(" passed, 1 failed"), "{stdout:#?}");
}

#[test]
fn the_command_refuses_an_unknown_adapter_in_words() {
    for args in [&["selftest", "--device", "gpu", "--adapter", "99"][..], &["selftest", "--adapter", "no such adapter"]] {
        let out = zerostream(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with("error: ") && !stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains("adapter"), "{stderr}");
    }
}

/// `--json`: one object per check (kernel, passed, cases, tolerance, worst), then the summary.
#[test]
fn the_command_writes_json_a_script_can_read() {
    let device = if gpu_or_skip("the_command_writes_json_a_script_can_read").is_some() { "gpu" } else { "cpu" };
    let out = zerostream(&["selftest", "--device", device, "--quick", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let objects: Vec<serde_json::Value> = lines(&out.stdout).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (summary, checks) = objects.split_last().unwrap();
    assert!(checks.iter().all(|c| c["kind"] == "check" && c["passed"] == true && c["cases"].as_u64() > Some(0)));
    assert!(checks.iter().all(|c| c["kernel"].is_string() && c["seconds"].is_number() && !c["tolerance"].is_null()));
    assert_eq!(summary["kind"], "summary");
    assert_eq!(summary["passed"].as_u64(), Some(checks.len() as u64));
    assert_eq!(summary["failed"].as_u64(), Some(0));
    assert!(summary["adapter"].is_string() && summary["seconds"].is_number() && summary["not_checked"].is_array(), "{summary}");
    if device == "gpu" && !gpu_or_skip("json").unwrap().has_coop_matmul() {
        assert_eq!(summary["not_checked"][0]["kernel"], "matmul_coop", "{summary}");
        assert!(summary["not_checked"][0]["why"].is_string());
    }
}
