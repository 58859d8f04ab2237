//! The `--metrics` file, a JSON object per step and line: one reader for every use of an existing
//! file (the checks before a run, the note when a fresh run replaces one, a resume's trim), so what
//! counts as a row, and that only regular files are read, is decided here once.

use std::io::BufRead;
use std::path::Path;

use anyhow::{Context, Result, bail};
use zerostream_checkpoints::checkpoint::write_file_atomic;

use super::checkpoint::TrainerState;

/// Whether `path` is a regular file. Only those are read as metrics: /dev/zero or a pipe would read
/// without end, and a resume's trim would put a file in place of a device.
pub fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Whether the rows go to a stream rather than a file (`--metrics /dev/stdout`, a pipe): nothing is
/// written beside it (no resolved configuration or plot in /dev) and nothing is read back.
pub fn is_a_stream(metrics: &Path) -> bool {
    std::fs::metadata(metrics).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// Shows `row` each row of the `--metrics` file there is (none where there is no regular file), one
/// at a time with its line as written, refusing a line that is not a metrics row (a JSON object with
/// a step): a fresh run replaces the file and a resumed one trims it, so anything else there would be
/// lost. A last line without its newline that is not a row is one a stopped run left half written,
/// which a resume drops.
pub fn metrics_rows(path: &Path, mut row: impl FnMut(serde_json::Value, &[u8])) -> Result<()> {
    if !is_regular_file(path) {
        return Ok(());
    }
    let file = std::fs::File::open(path).with_context(|| format!("--metrics {}: cannot read it", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let (mut line, mut number) = (Vec::new(), 0);
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).with_context(|| format!("--metrics {}: cannot read it", path.display()))?;
        if read == 0 {
            return Ok(());
        }
        number += 1;
        let parsed = serde_json::from_slice::<serde_json::Value>(&line).ok().filter(|v| v["step"].is_u64());
        match parsed {
            Some(r) => row(r, &line),
            None if line.trim_ascii().is_empty() => {}
            None if !line.ends_with(b"\n") => {} // the last line, half written
            None => bail!(
                "--metrics {}: line {number} is not a metrics row, so it is not a metrics file (one JSON object with a step per \
                 line), which the run would replace (or, resumed, trim); name another path, or move the file away",
                path.display()
            ),
        }
    }
}

/// How many rows the metrics file at `path` holds (0 where there is none).
pub fn count_rows(path: &Path) -> Result<u64> {
    let mut rows = 0;
    metrics_rows(path, |_, _| rows += 1)?;
    Ok(rows)
}

/// Refuses, on a resume from the checkpoint `dir`, a `--metrics` file whose row of the checkpoint's
/// last step has another loss than the checkpoint recorded for it: another run's rows, which the
/// resume would trim and continue as if they were this run's. A file with rows but none of that step
/// is not refused (a row lost with a crash after the checkpoint is possible): the warning to give is
/// returned, for the launch to say once nothing else refuses the run.
pub fn check_metrics_continue(path: &Path, dir: &Path, state: &TrainerState) -> Result<Option<String>> {
    let (Some(want), Some(last)) = (state.last_loss, state.step.checked_sub(1)) else { return Ok(None) };
    let (mut rows, mut got) = (0u64, None);
    metrics_rows(path, |r, _| {
        rows += 1;
        if r["step"].as_u64() == Some(last) && r["loss"].is_number() {
            got = r["loss"].as_f64();
        }
    })?;
    match got {
        Some(got) if got != want => bail!(
            "--metrics {}: its row of step {last} has loss {got}, but the checkpoint {} recorded loss {want} for that step: \
             the rows are another run's; name this run's metrics file, or a new one",
            path.display(),
            dir.display()
        ),
        None if rows > 0 => Ok(Some(format!(
            "warning: --metrics {} holds {} but none of step {last}, the last the checkpoint {} trained: if they are \
             another run's, the resumed run's rows will follow them",
            path.display(),
            crate::words::counted(rows, "row"),
            dir.display()
        ))),
        _ => Ok(None),
    }
}

/// Replaces the metrics file at `path` (a resumed run's) with its rows of steps before `step`, as
/// written, so the resumed run's rows continue it without duplicates; returns how many rows went.
/// No regular file, nothing done.
pub fn keep_rows_before(path: &Path, step: u64) -> Result<u64> {
    if !is_regular_file(path) {
        return Ok(0);
    }
    let (mut kept, mut dropped) = (Vec::new(), 0);
    metrics_rows(path, |r, line| {
        if r["step"].as_u64().is_some_and(|s| s < step) {
            kept.extend_from_slice(line);
            if !line.ends_with(b"\n") {
                kept.push(b'\n');
            }
        } else {
            dropped += 1;
        }
    })?;
    // Written even with no row dropped: a half-written last line goes too.
    write_file_atomic(path, &kept)?;
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("zs-metrics-file-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_resume_keeps_the_earlier_rows_as_written_and_drops_a_half_written_one() {
        let rows = "{\"step\":0,\"loss\":2.5}\n\n{\"loss\":2.25, \"step\":1}\n{\"step\":2,\"loss\":2.0}\n{\"step\":3,\"lo";
        let path = file_with("trim", rows);
        assert_eq!(count_rows(&path).unwrap(), 3);
        assert_eq!(keep_rows_before(&path, 2).unwrap(), 1);
        // Kept byte for byte (key order and spacing as the run wrote them), the blank line gone.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"step\":0,\"loss\":2.5}\n{\"loss\":2.25, \"step\":1}\n");
        // A complete last row without its newline is kept, and given one.
        std::fs::write(&path, "{\"step\":0,\"loss\":1.0}").unwrap();
        keep_rows_before(&path, 1).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"step\":0,\"loss\":1.0}\n");
    }

    #[test]
    fn only_regular_files_are_read_or_trimmed() {
        let path = file_with("text", "a line of prose\nanother\n");
        let err = count_rows(&path).unwrap_err().to_string();
        assert!(err.contains("line 1 is not a metrics row"), "{err}");
        assert!(keep_rows_before(&path, 1).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a line of prose\nanother\n", "nothing trimmed");
        // A pipe (or a device: a resume with --metrics /dev/null) reads as no rows and is never
        // replaced by a file. A pipe here, so a regression cannot replace the machine's /dev/null.
        #[cfg(unix)]
        {
            let fifo = path.with_file_name("pipe.jsonl");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
            assert!(made.success(), "mkfifo {}", fifo.display());
            assert_eq!(count_rows(&fifo).unwrap(), 0);
            keep_rows_before(&fifo, 1).unwrap();
            assert!(!std::fs::metadata(&fifo).unwrap().is_file(), "the pipe is still a pipe");
            std::fs::remove_file(&fifo).unwrap();
        }
        assert_eq!(count_rows(Path::new("/no/such/metrics.jsonl")).unwrap(), 0);
    }
}
