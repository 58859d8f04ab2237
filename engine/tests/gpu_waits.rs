//! No wait on the GPU is unbounded: every call that blocks until the GPU finishes (wgpu's `poll` with a
//! wait, Vulkan's fence and timeline-semaphore waits, a device or queue's idle wait) is one slice of
//! `device::gpu::wait::wait_in_slices`, which reports a wait that goes on and gives it up at the limit
//! (`ZEROSTREAM_GPU_WAIT_LIMIT_S`). A new blocking call elsewhere fails here: route it through
//! `GpuDevice::wait_for_submission` or `wait_in_slices` instead.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Calls that block on the GPU.
const BLOCKING: &[&str] =
    &["PollType::Wait", "wait_indefinitely", "raw.wait_for_fences(", "raw.wait_semaphores(", "device_wait_idle", "queue_wait_idle"];
/// The one place each may appear (under engine/src/), as a slice of `wait_in_slices`.
const SLICES: &[(&str, &str)] = &[
    ("device/gpu/wait.rs", "PollType::Wait"),
    ("device/gpu/copy_queue/vulkan.rs", "raw.wait_for_fences("),
    ("device/gpu/copy_route.rs", "raw.wait_semaphores("),
];

fn scan(src: &Path, dir: &Path, found: &mut Vec<(String, String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            scan(src, &path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let under_src = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let code = line.split("//").next().unwrap_or("");
                for call in BLOCKING.iter().filter(|c| code.contains(*c)) {
                    found.push((under_src.clone(), call.to_string(), line.trim().to_string()));
                }
            }
        }
    }
}

#[test]
fn every_wait_on_the_gpu_is_a_slice_of_a_bounded_wait() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    scan(&src, &src, &mut found);
    let unbounded: Vec<String> = found
        .iter()
        .filter(|(file, call, line)| !(SLICES.contains(&(file.as_str(), call.as_str())) && line.contains("slice")))
        .map(|(file, call, line)| format!("engine/src/{file}: {call} outside wait_in_slices: {line}"))
        .collect();
    assert!(unbounded.is_empty(), "waits on the GPU without the wait limit:\n{}", unbounded.join("\n"));
    // The scan does look: each slice is found where it is.
    for (file, call) in SLICES {
        let n = found.iter().filter(|(f, c, _)| f == file && c == call).count();
        assert_eq!(n, 1, "{call} in engine/src/{file}: expected once, found {n} times");
    }
}

/// At the limit the process stops with the error, at once: no unwind that would wait on the device.
/// Here a product that takes lavapipe many seconds (GPT-2 1.5B's qkv projection at B=4, T=1024:
/// 63 GFLOP) stands in for a hung kernel under a 1 s limit. On the adapter `--device gpu` opens by
/// default (skipped without one, failed under ZEROSTREAM_REQUIRE_GPU=1); on a fast GPU the product
/// finishes in time, so only a software adapter runs the check.
#[test]
fn a_wait_past_the_limit_ends_the_process_with_the_error() {
    let test = "a_wait_past_the_limit_ends_the_process_with_the_error";
    let Some(dev) = common::gpu_or_skip(test) else { return };
    let software = zerostream::device::Backend::describe(&dev).contains("(Vulkan, Cpu)");
    drop(dev);
    if !software {
        return eprintln!("SKIPPED {test}: this adapter is not a software one (the product would finish within the limit)");
    }
    let began = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_zerostream"))
        .args(["bench", "kernels", "--models", "gpt2-xl", "--only", "matmul", "--reps", "1", "--copy-size", "16MiB"])
        .env("ZEROSTREAM_GPU_WAIT_LIMIT_S", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running zerostream");
    while child.try_wait().unwrap().is_none() {
        if began.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("still running after 120 s under a 1 s wait limit");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("has not finished") && err.contains("ZEROSTREAM_GPU_WAIT_LIMIT_S") && !err.contains("panicked"), "{err}");
}
