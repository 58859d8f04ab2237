//! `zerostream train --tensorboard DIR`: the step loop's second sink beside `--metrics`. Each step's
//! metrics row (the very JSON object written to the metrics file) becomes one TensorBoard event whose
//! scalars are the row's numbers, so the two records always agree; the run's resolved configuration
//! is a text summary at the first step. Files are TFRecord-framed `tensorflow.Event` protobufs
//! ([`record`], [`proto`]), one new file per run (a resumed run adds one beside the earlier ones, and
//! TensorBoard merges them). Rank 0 alone writes.

mod proto;
pub mod record;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use prost::Message;

use proto::{Event, SESSION_START, SessionLog, Summary, Value, What};

/// What `--tensorboard` asks a run for.
#[derive(Clone, Debug)]
pub struct TensorBoard {
    /// The log directory (`tensorboard --logdir DIR`).
    pub dir: PathBuf,
    /// The run's resolved configuration (the TOML written beside `--metrics`), shown as text.
    pub config_toml: String,
}

/// The tag of the configuration's text summary.
pub const CONFIG_TAG: &str = "config";

impl TensorBoard {
    /// Creates `dir` if missing and checks that a file can be written in it, so a bad path is refused
    /// before training starts. Under mpirun only rank 0 checks: the others never write there.
    pub fn prepare(dir: &Path, config_toml: &str) -> Result<TensorBoard> {
        if crate::comm::launcher_rank() == 0 {
            check_writable(dir)?;
        }
        Ok(TensorBoard { dir: dir.to_path_buf(), config_toml: config_toml.to_string() })
    }
}

fn check_writable(dir: &Path) -> Result<()> {
    let flag = format!("--tensorboard {}", dir.display());
    if dir.exists() && !dir.is_dir() {
        anyhow::bail!("{flag}: exists and is not a directory");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("{flag}: cannot create the directory"))?;
    // A probe file rather than the permission bits: they do not tell about read-only mounts, ACLs
    // or a full disk's quota the way a real write does.
    let probe = dir.join(format!(".zerostream-write-check.{}", std::process::id()));
    std::fs::write(&probe, b"").with_context(|| format!("{flag}: cannot write a file in the directory"))?;
    std::fs::remove_file(&probe).with_context(|| format!("{flag}: cannot remove the check file {}", probe.display()))
}

/// One event file, written record by record.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (created if missing), named as TensorFlow names them:
    /// `events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>`, `n` the first number free. Its first
    /// record is the file version, as every reader expects.
    pub fn create(dir: &Path) -> Result<EventWriter> {
        let flag = format!("--tensorboard {}", dir.display());
        std::fs::create_dir_all(dir).with_context(|| format!("{flag}: cannot create the directory"))?;
        let unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let stem = format!("events.out.tfevents.{unix_s}.{}.{}", hostname(), std::process::id());
        let mut n = 0u32;
        let (file, path) = loop {
            let path = dir.join(format!("{stem}.{n}"));
            // create_new: two writers in one process and second (a library caller's runs) get two files.
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e).with_context(|| format!("{flag}: cannot create {}", path.display())),
            }
        };
        let mut writer = EventWriter { file: BufWriter::new(file), path };
        writer.write(0, What::FileVersion("brain.Event:2".into())).with_context(|| format!("{flag}: writing {}", writer.path.display()))?;
        Ok(writer)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One event at `step` holding `scalars` (tag, value).
    pub fn scalars(&mut self, step: u64, scalars: &[(String, f32)]) -> std::io::Result<()> {
        let value = scalars.iter().map(|(tag, v)| Value::scalar(tag, *v)).collect();
        self.write(step, What::Summary(Summary { value }))
    }

    /// A text summary at `step` (the text dashboard renders it as Markdown).
    pub fn text(&mut self, step: u64, tag: &str, text: &str) -> std::io::Result<()> {
        self.write(step, What::Summary(Summary { value: vec![Value::text(tag, text)] }))
    }

    /// Marks a (re)start at `step`: readers drop what an earlier run logged for `step` and later, as
    /// the metrics file drops its rows past a resumed checkpoint.
    pub fn session_start(&mut self, step: u64) -> std::io::Result<()> {
        self.write(step, What::SessionLog(SessionLog { status: SESSION_START }))
    }

    /// Hands the buffered records to the OS, so a crash of the process loses nothing written so far.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }

    fn write(&mut self, step: u64, what: What) -> std::io::Result<()> {
        let wall_time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let step = i64::try_from(step).unwrap_or(i64::MAX);
        let event = Event { wall_time, step, what: Some(what) };
        self.file.write_all(&record::frame(&event.encode_to_vec()))
    }
}

/// The machine's name for event file names (TensorBoard shows none of it), in characters safe in a
/// file name; "localhost" when the OS does not say.
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let safe: String = name.trim().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    if safe.is_empty() { "localhost".into() } else { safe }
}

/// The step loop's TensorBoard writer: nothing without `--tensorboard` (or off rank 0), and after a
/// failed write nothing more, like the metrics file: the record of a run never stops the run.
pub struct Sink {
    writer: Option<EventWriter>,
}

impl Sink {
    /// Opens a new event file for a run whose first step is `first_step` (above 0: resumed) and writes
    /// the configuration's text at that step.
    pub fn open(options: Option<&TensorBoard>, first_step: u64) -> Result<Sink> {
        let Some(options) = options else { return Ok(Sink { writer: None }) };
        let mut writer = EventWriter::create(&options.dir)?;
        let config = format!("```toml\n{}\n```", options.config_toml.trim_end());
        let start = if first_step > 0 { writer.session_start(first_step) } else { Ok(()) };
        start
            .and_then(|()| writer.text(first_step, CONFIG_TAG, &config))
            .and_then(|()| writer.flush())
            .with_context(|| format!("--tensorboard {}: writing {}", options.dir.display(), writer.path().display()))?;
        Ok(Sink { writer: Some(writer) })
    }

    /// Writes the step's metrics `row` as scalars and flushes. On failure returns the warning to show,
    /// once, and writes nothing more.
    pub fn write_step(&mut self, step: u64, row: &serde_json::Value) -> Option<String> {
        let writer = self.writer.as_mut()?;
        let written = writer.scalars(step, &scalars_of(row)).and_then(|()| writer.flush());
        let e = written.err()?;
        let warning = format!(
            "warning: writing --tensorboard {} failed at step {step} ({e}); training continues without TensorBoard events",
            writer.path().display()
        );
        self.writer = None;
        Some(warning)
    }
}

/// Every number of a metrics row as a (tag, value) scalar, in the row's order. Nested fields keep
/// their path (`time.total_s` -> `time/total_s`); top-level ones get a group, for the dashboard's
/// sections (`loss/val_loss`, `links/upload_bytes`); see [`group_of`]. `step` is the event's step, not a
/// scalar; booleans and nulls (`applied`, a missing `gpu_kernels_s`) are not numbers and are left out.
pub fn scalars_of(row: &serde_json::Value) -> Vec<(String, f32)> {
    let mut out = Vec::new();
    let Some(fields) = row.as_object() else { return out };
    for (name, value) in fields {
        match value {
            serde_json::Value::Object(inner) => {
                for (leaf, v) in inner {
                    if let Some(x) = v.as_f64() {
                        out.push((format!("{name}/{leaf}"), x as f32));
                    }
                }
            }
            v if name != "step" => {
                if let Some(x) = v.as_f64() {
                    out.push((format!("{}/{name}", group_of(name)), x as f32));
                }
            }
            _ => {}
        }
    }
    out
}

/// The dashboard section of a top-level metrics field.
fn group_of(name: &str) -> &'static str {
    match name {
        "loss" | "val_loss" | "val_perplexity" => "loss",
        "lr" | "grad_norm" | "loss_scale" => "optimizer",
        "peak_device_bytes" | "peak_rss_bytes" => "memory",
        n if n.starts_with("comm") => "comm",
        n if n.ends_with("_bytes") || n.ends_with("_gbps") => "links",
        _ => "throughput",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_becomes_grouped_scalars() {
        let row = serde_json::json!({
            "step": 3, "loss": 2.5, "applied": true, "lr": 0.0, "tokens_per_s": 100.0, "upload_bytes": 4096,
            "comm_s": 0.5, "peak_device_bytes": 10, "gpu_busy_fraction": null,
            "time": {"total_s": 1.25, "gpu_kernels_s": null},
        });
        let got = scalars_of(&row);
        let want = [
            ("loss/loss", 2.5),
            ("optimizer/lr", 0.0),
            ("throughput/tokens_per_s", 100.0),
            ("links/upload_bytes", 4096.0),
            ("comm/comm_s", 0.5),
            ("memory/peak_device_bytes", 10.0),
            ("time/total_s", 1.25),
        ];
        let got_sorted: std::collections::BTreeMap<_, _> = got.iter().map(|(t, v)| (t.as_str(), *v)).collect();
        let want_sorted: std::collections::BTreeMap<_, _> = want.iter().copied().collect();
        assert_eq!(got_sorted, want_sorted);
    }

    #[test]
    fn an_event_file_reads_back_record_by_record() {
        let dir = tempfile::tempdir().unwrap();
        let options = TensorBoard { dir: dir.path().join("tb"), config_toml: "lr = 0.002\n".into() };
        let mut sink = Sink::open(Some(&options), 5).unwrap();
        assert_eq!(sink.write_step(5, &serde_json::json!({"step": 5, "loss": 0.0})), None);
        let path = sink.writer.as_ref().unwrap().path().to_path_buf();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("events.out.tfevents.") && name.ends_with(&format!(".{}.0", std::process::id())), "{name}");
        // A second writer in the same second gets the next number, not the same file.
        let second = EventWriter::create(&options.dir).unwrap();
        assert_ne!(second.path(), path);

        let bytes = std::fs::read(&path).unwrap();
        let events: Vec<Event> = record::unframe(&bytes).unwrap().iter().map(|p| Event::decode(p.as_slice()).unwrap()).collect();
        assert_eq!(events.len(), 4, "version, start, config, one step");
        assert_eq!(events[0].what, Some(What::FileVersion("brain.Event:2".into())));
        assert_eq!(events[1].what, Some(What::SessionLog(SessionLog { status: SESSION_START })));
        assert!(events[1..].iter().all(|e| e.step == 5));
        let Some(What::Summary(text)) = &events[2].what else { panic!("{:?}", events[2]) };
        assert_eq!(text.value[0], Value::text(CONFIG_TAG, "```toml\nlr = 0.002\n```"));
        // A zero is still written: the oneof keeps it.
        let Some(What::Summary(step)) = &events[3].what else { panic!("{:?}", events[3]) };
        assert_eq!(step.value, vec![Value::scalar("loss/loss", 0.0)]);
    }

    #[test]
    fn a_path_that_is_a_file_is_refused_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("taken");
        std::fs::write(&file, "x").unwrap();
        let err = TensorBoard::prepare(&file, "").unwrap_err().to_string();
        assert!(err.contains("--tensorboard") && err.contains("taken") && err.contains("not a directory"), "{err}");
    }
}
