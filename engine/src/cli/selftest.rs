//! `zerostream selftest`: every kernel on this device against its plain-Rust twin
//! ([`zerostream::selftest`]), a line per kernel in words (or a JSON object each), what the adapter
//! lacks, and `selftest: N passed, M failed`; exit code 0 when nothing failed, 1 when something did.
//!
//! A watchdog thread ends the run (exit code 1, the check named) when one check takes longer than
//! `--check-timeout`: a hung kernel must not eat a borrowed GPU's time.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use zerostream::device;
use zerostream::selftest::{self, CheckResult, Event, NotChecked, Size};

use crate::DeviceArgs;

#[derive(clap::Args)]
pub struct SelftestArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Print one JSON object per check, then a summary object (`"kind": "summary"`: adapter, passed,
    /// failed, not_checked, lacks, seconds), instead of text; the text lines go to stderr as progress.
    #[arg(long)]
    json: bool,
    /// Leave out the largest shapes of each check (for slow adapters; the command's default is every shape).
    #[arg(long)]
    quick: bool,
    /// Seconds one check may take before the adapter is taken to be hung (on the cpu device: too slow):
    /// the run then stops with that check failed (exit code 1), whether it is still running or finished
    /// late. 0: no limit, as ZEROSTREAM_GPU_WAIT_LIMIT_S=0 for the waits of other commands.
    #[arg(long, default_value_t = 120.0, value_parser = crate::parse_seconds)]
    check_timeout: f64,
}

/// What the output has said so far, shared with the watchdog.
struct Progress {
    json: bool,
    /// `--quiet`: with --json, no text lines on stderr.
    quiet: bool,
    device: String,
    /// What a check past its time says of the device: "the adapter may be hung" on a GPU.
    hung: &'static str,
    lacks: Vec<String>,
    not_checked: Vec<NotChecked>,
    started: Instant,
    /// The check running now, since when.
    running: Option<(String, Instant)>,
    passed: usize,
    failed: usize,
}

impl Progress {
    /// Prints one result: its line on stdout, or its JSON object there and its line on stderr.
    fn report(&mut self, r: &CheckResult) {
        if r.passed() {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        if self.json {
            println!("{}", r.to_json());
            if !self.quiet {
                eprintln!("{}", r.line());
            }
        } else {
            println!("{}", r.line());
        }
        let _ = std::io::stdout().flush();
    }

    /// What the adapter lacks, then the last line (or the summary object).
    fn finish(&self, extra: Option<&str>) {
        let seconds = self.started.elapsed().as_secs_f64();
        if self.json {
            let mut summary = selftest::summary_json(&self.device, self.passed, self.failed, &self.not_checked, &self.lacks, seconds);
            if let Some(e) = extra {
                summary["error"] = e.into();
            }
            println!("{summary}");
        } else {
            if !self.lacks.is_empty() || !self.not_checked.is_empty() {
                println!("this device lacks:");
            }
            self.lacks.iter().for_each(|l| println!("  {l}"));
            self.not_checked.iter().for_each(|n| println!("  not checked: {} ({})", n.kernel, n.why));
            println!("{} on {}", zerostream::words::seconds(seconds), self.device);
            println!("{}", selftest::summary_line(self.passed, self.failed));
        }
        let _ = std::io::stdout().flush();
    }

    /// When the running check has taken longer than `limit`: reports it failed, says what was found so
    /// far and ends the process (exit code 1).
    fn stop_if_overdue(&mut self, limit: Option<Duration>) {
        let (Some((name, since)), Some(limit)) = (self.running.clone(), limit) else { return };
        if since.elapsed() <= limit {
            return;
        }
        let why = format!("did not finish within {} s: {}; the run stops here", limit.as_secs_f64(), self.hung);
        let mut r = CheckResult::failed(&name, why.clone());
        r.seconds = since.elapsed().as_secs_f64();
        self.report(&r);
        self.finish(Some(&format!("{name} {why}")));
        std::process::exit(1);
    }
}

/// Watches the running check (five times a second) and stops the run when it is overdue; none
/// without a limit.
fn watchdog(progress: Arc<Mutex<Progress>>, limit: Option<Duration>) {
    if limit.is_none() {
        return;
    }
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            progress.lock().unwrap_or_else(|e| e.into_inner()).stop_if_overdue(limit);
        }
    });
}

/// Runs the self-test; returns the exit code (1 when a check failed).
pub fn run(args: SelftestArgs, quiet: bool) -> Result<i32> {
    let dev = device::open(args.device.device, args.device.adapter.as_deref(), None)?;
    let device = dev.describe();
    if args.json {
        if !quiet {
            eprintln!("selftest on {device}");
        }
    } else {
        println!("selftest on {device}");
    }
    let progress = Arc::new(Mutex::new(Progress {
        json: args.json,
        quiet,
        device,
        hung: match dev {
            device::AnyDevice::Gpu(_) => "the adapter may be hung",
            device::AnyDevice::Cpu(_) => "too slow for --check-timeout",
        },
        lacks: selftest::lacks(&dev),
        not_checked: selftest::not_checked(&dev),
        started: Instant::now(),
        running: None,
        passed: 0,
        failed: 0,
    }));
    let limit = (args.check_timeout > 0.0).then(|| Duration::from_secs_f64(args.check_timeout));
    watchdog(progress.clone(), limit);
    let size = if args.quick { Size::Quick } else { Size::Full };
    let report = selftest::run(&dev, size, &mut |event| {
        let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Started(name) => p.running = Some((name.to_string(), Instant::now())),
            // A check that finished late is as overdue as one still running.
            Event::Finished(r) => {
                p.stop_if_overdue(limit);
                p.report(r)
            }
        }
    });
    let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
    p.running = None;
    p.finish(None);
    Ok(if report.failed() == 0 { 0 } else { 1 })
}
