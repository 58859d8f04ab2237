//! How long the host waits for the GPU. Every wait (for a wgpu submission, a copy queue's fences or its
//! timeline semaphores) goes through [`wait_in_slices`]: it waits a minute at a time, says on stderr
//! each minute that it still waits (so a hung kernel or device shows as one, not as a silent stall),
//! and gives up after the limit: `ZEROSTREAM_GPU_WAIT_LIMIT_S` seconds (default 600; 0 waits for good).
//! One wait covers what was submitted before it, which a slow software adapter running a large model
//! can take minutes over: raise the limit there, or set 0.
//!
//! Giving up ends the process, with the error on stderr: an unwind would drop wgpu's device, whose
//! queue waits to go idle without a limit, and so would hang on the hung GPU after all. A flag set
//! first makes any other thread's wait fail at once meanwhile. A child module of `gpu`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::GpuDevice;

/// The environment variable that sets the limit, in seconds.
pub const WAIT_LIMIT_VAR: &str = "ZEROSTREAM_GPU_WAIT_LIMIT_S";
/// The limit where the variable is not set.
const DEFAULT_LIMIT: Duration = Duration::from_secs(600);
/// How often a wait that goes on says so.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// Set when a wait under the process's limits has given up: the GPU is hung.
static GIVEN_UP: AtomicBool = AtomicBool::new(false);

/// How long one wait may take: reported every `report_every`, given up after `limit` (None: never).
#[derive(Clone, Copy, Debug)]
pub(in crate::device) struct WaitLimits {
    pub(in crate::device) report_every: Duration,
    pub(in crate::device) limit: Option<Duration>,
    /// Set when this wait gives up, and failing every wait at once while set (the process's limits:
    /// [`GIVEN_UP`]; none for a test's own).
    pub(in crate::device) given_up: Option<&'static AtomicBool>,
}

impl WaitLimits {
    /// The process's limits: `ZEROSTREAM_GPU_WAIT_LIMIT_S`, read once. A value that is not a whole
    /// number of seconds is refused when the device opens ([`GpuDevice::open`] calls this first), so
    /// the later waits never see it.
    pub(in crate::device) fn from_env() -> Result<WaitLimits> {
        static LIMITS: OnceLock<Result<WaitLimits, String>> = OnceLock::new();
        LIMITS
            .get_or_init(|| parse_limit(std::env::var(WAIT_LIMIT_VAR).ok().as_deref()).map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow!(e))
    }

    /// [`Self::from_env`] where the device is open already (so the value was checked).
    pub(in crate::device) fn current() -> WaitLimits {
        Self::from_env().unwrap_or(WaitLimits { report_every: REPORT_EVERY, limit: Some(DEFAULT_LIMIT), given_up: Some(&GIVEN_UP) })
    }
}

/// The limits `value` (the variable's text, if set) asks for.
fn parse_limit(value: Option<&str>) -> Result<WaitLimits> {
    let limit = match value.map(str::trim) {
        None | Some("") => Some(DEFAULT_LIMIT),
        Some(text) => match text.parse::<u64>() {
            Ok(0) => None,
            Ok(seconds) => Some(Duration::from_secs(seconds)),
            Err(_) => bail!(
                "{WAIT_LIMIT_VAR}={text:?}: expected a whole number of seconds a wait for the GPU may take \
                 (0: no limit; unset: {} s)",
                DEFAULT_LIMIT.as_secs()
            ),
        },
    };
    Ok(WaitLimits { report_every: REPORT_EVERY, limit, given_up: Some(&GIVEN_UP) })
}

/// What became of one slice of a wait.
pub(in crate::device) enum Slice {
    Done,
    /// The slice's time passed with the work unfinished.
    TimedOut,
}

/// Waits for `what` by calling `wait(slice)` until it is done: a line on stderr each `report_every`
/// it goes on, an error naming `what` after `limit`, the first other error returned as it is.
pub(in crate::device) fn wait_in_slices(
    what: &dyn Fn() -> String,
    limits: WaitLimits,
    mut wait: impl FnMut(Duration) -> Result<Slice>,
) -> Result<()> {
    if limits.given_up.is_some_and(|flag| flag.load(Ordering::Acquire)) {
        bail!("not waiting for the GPU to finish {}: an earlier wait gave it up as hung", what());
    }
    let began = Instant::now();
    loop {
        let waited = began.elapsed();
        let slice = match limits.limit {
            Some(limit) if waited >= limit => {
                // One last look: the process may have been stopped (a suspended job) while the work ran.
                if let Slice::Done = wait(Duration::ZERO)? {
                    return Ok(());
                }
                let error = anyhow!(
                    "the GPU has not finished {} after {} s: a hung kernel or device ({WAIT_LIMIT_VAR} sets \
                     the limit; 0 waits for good)",
                    what(),
                    waited.as_secs()
                );
                if let Some(flag) = limits.given_up {
                    flag.store(true, Ordering::Release);
                    if std::ptr::eq(flag, &GIVEN_UP) {
                        eprintln!("error: {error:#}; stopping the process (an unwind would wait on the hung device)");
                        std::process::exit(1);
                    }
                }
                return Err(error);
            }
            Some(limit) => limits.report_every.min(limit - waited),
            None => limits.report_every,
        };
        if let Slice::Done = wait(slice)? {
            return Ok(());
        }
        let waited = began.elapsed();
        if limits.limit.is_none_or(|limit| waited < limit) {
            crate::progress::eprint_above_bar(&format!(
                "zerostream: still waiting for the GPU to finish {} ({} s so far)",
                what(),
                waited.as_secs()
            ));
        }
    }
}

impl GpuDevice {
    /// Blocks until `submission` (None: everything submitted) and the submissions before it are done on
    /// the device, not later ones. Err where the device is lost, or the wait passes the limit.
    pub(in crate::device) fn wait_for_submission(device: &wgpu::Device, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        Self::wait_for_submission_within(device, submission, WaitLimits::current())
    }

    /// [`Self::wait_for_submission`] under the given limits.
    pub(in crate::device) fn wait_for_submission_within(
        device: &wgpu::Device,
        submission: Option<wgpu::SubmissionIndex>,
        limits: WaitLimits,
    ) -> Result<()> {
        let what = || match &submission {
            Some(_) => "a submission".to_string(),
            None => "the work submitted".to_string(),
        };
        wait_in_slices(&what, limits, |slice| {
            match device.poll(wgpu::PollType::Wait { submission_index: submission.clone(), timeout: Some(slice) }) {
                Ok(_) => Ok(Slice::Done),
                Err(wgpu::PollError::Timeout) => Ok(Slice::TimedOut),
                Err(e) => Err(anyhow!("GPU device lost: {e}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn the_limit_is_read_from_its_variable() {
        assert_eq!(parse_limit(None).unwrap().limit, Some(DEFAULT_LIMIT));
        assert_eq!(parse_limit(Some(" ")).unwrap().limit, Some(DEFAULT_LIMIT));
        assert_eq!(parse_limit(Some("30")).unwrap().limit, Some(Duration::from_secs(30)));
        assert_eq!(parse_limit(Some("0")).unwrap().limit, None);
        for bad in ["ten", "-5", "1.5"] {
            let e = format!("{:#}", parse_limit(Some(bad)).unwrap_err());
            assert!(e.contains(WAIT_LIMIT_VAR) && e.contains(bad), "{e}");
        }
    }

    /// A wait that never ends is given up once its slices pass the limit, with words naming what it
    /// waited for; one that ends is done; an error from a slice comes back as it is.
    #[test]
    fn a_wait_gives_up_at_its_limit() {
        let given_up = Box::leak(Box::new(AtomicBool::new(false)));
        let limits =
            WaitLimits { report_every: Duration::from_millis(5), limit: Some(Duration::from_millis(30)), given_up: Some(given_up) };
        let slices = Cell::new(0);
        let e = wait_in_slices(&|| "the test's work".into(), limits, |slice| {
            assert!(slice <= limits.report_every);
            slices.set(slices.get() + 1);
            std::thread::sleep(slice);
            Ok(Slice::TimedOut)
        })
        .unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("the test's work") && text.contains(WAIT_LIMIT_VAR), "{text}");
        // Up to 6 slices of 5 ms or more, then one last look without waiting.
        assert!((2..=7).contains(&slices.get()), "{} slices of 5 ms or more in a 30 ms limit", slices.get());

        // Given up once, every later wait fails without waiting.
        let e = wait_in_slices(&|| "the next work".into(), limits, |_| panic!("waited on a hung GPU")).unwrap_err();
        assert!(format!("{e:#}").contains("gave it up as hung"), "{e:#}");

        let fresh = WaitLimits { given_up: None, ..limits };
        let calls = Cell::new(0);
        wait_in_slices(&|| "done on the third".into(), fresh, |_| {
            calls.set(calls.get() + 1);
            Ok(if calls.get() == 3 { Slice::Done } else { Slice::TimedOut })
        })
        .unwrap();
        assert_eq!(calls.get(), 3);

        let unlimited = WaitLimits { limit: None, ..fresh };
        let e = wait_in_slices(&|| "lost".into(), unlimited, |_| Err(anyhow!("device lost"))).unwrap_err();
        assert_eq!(e.to_string(), "device lost");
    }

    /// wgpu's timed wait on this adapter: a submission still running when its limit passes is given up
    /// with words, and the same submission waited for without that limit is done. On the adapter
    /// `--device gpu` opens by default (skipped without one, failed under ZEROSTREAM_REQUIRE_GPU=1).
    #[test]
    fn a_submission_still_running_is_given_up_at_the_limit() {
        let Some(dev) = super::super::gpu_or_skip("a_submission_still_running_is_given_up_at_the_limit") else { return };
        // 1 GiB of writes: ~0.3 ms on an H200, far longer on lavapipe; either way far past 1 µs.
        let big = crate::device::Backend::alloc(&dev, 32 << 20, "big").unwrap();
        for round in 0..8 {
            crate::device::Backend::fill(&dev, &big, round as f32);
        }
        let submission = dev.flush().expect("the fills were recorded");
        let tiny = WaitLimits { report_every: Duration::from_micros(1), limit: Some(Duration::from_micros(1)), given_up: None };
        let e = GpuDevice::wait_for_submission_within(&dev.device, Some(submission.clone()), tiny).unwrap_err();
        assert!(format!("{e:#}").contains("has not finished a submission"), "{e:#}");
        GpuDevice::wait_for_submission(&dev.device, Some(submission)).unwrap();
    }
}
