//! No wait on the GPU is unbounded: every call that blocks until the GPU finishes (wgpu's `poll` with a
//! wait, Vulkan's fence and timeline-semaphore waits, a device or queue's idle wait) is one slice of
//! `gpu_wait::wait_in_slices`, which reports a wait that goes on and gives it up at the limit
//! (`ZEROSTREAM_GPU_WAIT_LIMIT_S`). A new blocking call elsewhere fails here: route it through
//! `GpuDevice::wait_for_submission` or `wait_in_slices` instead.

use std::path::Path;

/// Calls that block on the GPU.
const BLOCKING: &[&str] =
    &["PollType::Wait", "wait_indefinitely", "raw.wait_for_fences(", "raw.wait_semaphores(", "device_wait_idle", "queue_wait_idle"];
/// The one place each may appear (under engine/src/), as a slice of `wait_in_slices`.
const SLICES: &[(&str, &str)] = &[
    ("device/gpu_wait.rs", "PollType::Wait"),
    ("device/gpu_copy_queue_vulkan.rs", "raw.wait_for_fences("),
    ("device/gpu_copy_route.rs", "raw.wait_semaphores("),
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
