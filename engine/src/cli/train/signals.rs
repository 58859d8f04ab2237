//! SIGINT and SIGTERM (and Windows' Ctrl-Break, SIGBREAK) during `zerostream train`: the first finishes
//! the step, checkpoints and stops with 128 + the signal; another, a second or more later, ends the
//! process at once.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};

/// A signal this soon after the first is the same interrupt delivered twice (GNU `timeout` and a
/// terminal signal the whole process group, and a launcher may pass it on), not a second Ctrl-C.
const REPEATED_SIGNAL_MS: u64 = 1000;

/// The exit code of a run a signal stopped: 128 + the first signal's number (130 for SIGINT, 143 for
/// SIGTERM, as shells report them); 130 where it came to another rank of an MPI launch.
static STOPPED_EXIT_CODE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(130);

/// SIGINT and SIGTERM set the returned flag (the run finishes its step, checkpoints and stops, and
/// says so at once on stderr; it then exits 130 or 143); another, a second or more after the first,
/// ends the process at once (exit 130 or 143) without a checkpoint.
pub(super) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let stop = Arc::new(AtomicBool::new(false));
    let began = std::time::Instant::now();
    // When the first signal came: milliseconds since `began`, plus 1 (0: none yet).
    let first_ms = Arc::new(AtomicU64::new(0));
    // Windows raises no SIGTERM; its console's Ctrl-Break comes as SIGBREAK (21).
    #[cfg(windows)]
    let ctrl_break = Some((signal_hook::consts::SIGBREAK, 128 + signal_hook::consts::SIGBREAK));
    #[cfg(not(windows))]
    let ctrl_break = None;
    for (signal, code) in [(SIGINT, 130), (SIGTERM, 143)].into_iter().chain(ctrl_break) {
        let (stop, first_ms) = (stop.clone(), first_ms.clone());
        let action = move || {
            let now_ms = began.elapsed().as_millis() as u64 + 1;
            match first_ms.compare_exchange(0, now_ms, SeqCst, SeqCst) {
                Ok(_) => {
                    STOPPED_EXIT_CODE.store(code, SeqCst);
                    stop.store(true, SeqCst)
                }
                // Saturating: another handler may have stored a later time than this one read.
                Err(first) if now_ms.saturating_sub(first) >= REPEATED_SIGNAL_MS => signal_hook::low_level::exit(code),
                Err(_) => {}
            }
        };
        // SAFETY: the action is async-signal-safe: atomics, the monotonic clock (clock_gettime) and
        // _exit only; no allocation, lock or output.
        unsafe { signal_hook::low_level::register(signal, action) }.context("installing a signal handler")?;
    }
    // The handler cannot print; this thread says what the signal does as soon as it comes (the first
    // process of an MPI launch only).
    let seen = stop.clone();
    std::thread::spawn(move || {
        while !seen.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if zerostream::train::launch::first_process() {
            eprintln!(
                "train: stopping after this step (with a checkpoint where --checkpoint-dir is set); signal again, a second or \
                 more later, to stop at once without one"
            );
        }
    });
    Ok(stop)
}

/// The exit code of a run a signal stopped ([`STOPPED_EXIT_CODE`]).
pub(super) fn stopped_exit_code() -> i32 {
    STOPPED_EXIT_CODE.load(std::sync::atomic::Ordering::SeqCst)
}
