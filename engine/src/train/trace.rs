//! `train --trace FILE`: a timeline of where a step's time goes, in the Chrome trace event format
//! (Perfetto, chrome://tracing): one span per operation of the step schedule on rank 0's device thread
//! (fetches, forward and backward blocks, the head, each gradient download's start and finish, the
//! update hand-off) and one per group the optimizer thread updates. Host clocks only: a span on the
//! device thread is the time the host spent recording, submitting or waiting, not the GPU's own time
//! (the metrics' `gpu_kernels_s` and `gpu_busy_fraction` are that). Written as it goes, so a run that
//! stops early leaves the spans up to that point (the format allows the closing `]` to be missing).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};

/// The threads a trace shows, each a row of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Rank 0's device thread: the step schedule's operations.
    Device = 1,
    /// The optimizer thread: one span per group updated.
    Optimizer = 2,
}

impl Lane {
    fn name(self) -> &'static str {
        match self {
            Lane::Device => "device thread (step schedule)",
            Lane::Optimizer => "optimizer thread (update per group)",
        }
    }
}

/// An open trace file, shared by the threads that write spans to it.
pub struct Trace {
    path: PathBuf,
    start: Instant,
    out: Mutex<Output>,
}

struct Output {
    file: BufWriter<File>,
    /// The first write that failed: later spans are dropped, and [`Trace::finish`] reports it.
    error: Option<std::io::Error>,
    /// Finished: spans after that (the last step's update, which may end after the run's last step)
    /// are dropped, so the file stays one JSON array.
    closed: bool,
}

impl Trace {
    /// Creates (or replaces) `path` and writes the timeline's header: the process and its lanes.
    pub fn create(path: &Path) -> Result<Trace> {
        let file = File::create(path).with_context(|| format!("--trace: cannot create {}", path.display()))?;
        let trace = Trace {
            path: path.to_path_buf(),
            start: Instant::now(),
            out: Mutex::new(Output { file: BufWriter::new(file), error: None, closed: false }),
        };
        trace.write("[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"zerostream train (rank 0)\"}}");
        for lane in [Lane::Device, Lane::Optimizer] {
            let event = format!(
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":{}}}}}",
                lane as u32,
                json_string(lane.name())
            );
            trace.write(&event);
        }
        Ok(trace)
    }

    /// One span of `lane`, from `began` until now, named `name`; its category (what the timeline can
    /// filter on) is the name's first word: `forward`, `backward`, `download>`, `update`...
    pub fn span(&self, lane: Lane, name: &str, began: Instant) {
        let (ts, dur) = (self.micros(began), began.elapsed().as_secs_f64() * 1e6);
        let category = name.split([' ', '[']).next().unwrap_or_default();
        let event = format!(
            ",\n{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{ts:.1},\"dur\":{dur:.1}}}",
            json_string(name),
            json_string(category),
            lane as u32
        );
        self.write(&event);
    }

    /// Closes the timeline's array and flushes it; the first write error, if any, naming the file.
    pub fn finish(&self) -> Result<()> {
        // One guard for the bracket and the close: no span of another thread can land after the `]`.
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        Self::append(&mut out, "\n]\n");
        out.closed = true;
        let flushed = out.file.flush();
        match out.error.take().map_or(flushed, Err) {
            Ok(()) => Ok(()),
            Err(e) => Err(anyhow!("--trace: writing {} failed: {e}", self.path.display())),
        }
    }

    fn micros(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64() * 1e6
    }

    fn write(&self, text: &str) {
        Self::append(&mut self.out.lock().unwrap_or_else(|e| e.into_inner()), text);
    }

    fn append(out: &mut Output, text: &str) {
        if out.error.is_none()
            && !out.closed
            && let Err(e) = out.file.write_all(text.as_bytes())
        {
            out.error = Some(e);
        }
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// Times `f` as a span of `lane` named `name()` where a trace is being written.
pub fn traced<R>(trace: Option<&Trace>, lane: Lane, name: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
    let Some(trace) = trace else { return f() };
    let began = Instant::now();
    let r = f();
    trace.span(lane, &name(), began);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file parses as JSON once finished, and as JSON with `]` appended before (a run cut short):
    /// the header's lanes, then each span with its lane, name and a duration.
    #[test]
    fn spans_make_a_chrome_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let trace = Trace::create(&path).unwrap();
        traced(Some(&trace), Lane::Device, || "forward h.0 \"quoted\"".into(), || std::thread::sleep(std::time::Duration::from_millis(2)));
        trace.span(Lane::Optimizer, "update group 1", Instant::now());
        trace.out.lock().unwrap().file.flush().unwrap();
        let partial = std::fs::read_to_string(&path).unwrap() + "]";
        let events: Vec<serde_json::Value> = serde_json::from_str(&partial).unwrap();
        assert_eq!(events.len(), 5, "{partial}");
        trace.finish().unwrap();
        trace.span(Lane::Optimizer, "update group 2", Instant::now()); // after the end: dropped
        let events: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let forward = &events[3];
        let fields = |e: &serde_json::Value| (e["name"].as_str().map(String::from), e["cat"].as_str().map(String::from), e["tid"].as_u64());
        assert_eq!(fields(forward), (Some("forward h.0 \"quoted\"".into()), Some("forward".into()), Some(1)));
        assert_eq!(forward["ph"].as_str(), Some("X"));
        assert!(forward["dur"].as_f64().unwrap() >= 2000.0, "{forward}");
        assert_eq!(fields(&events[4]), (Some("update group 1".into()), Some("update".into()), Some(2)));
    }
}
