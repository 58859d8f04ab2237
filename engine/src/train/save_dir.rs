//! What a `--save` directory may hold, and the check before a run replaces it: saving replaces the
//! whole directory, so one holding anything but a model (and a file browser's litter) is refused.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Whether `name` is one of the files a saved model directory holds, so `--save` may replace it: the
/// weights and config, what `ModelExtras` adds (the tokenizer's files, generation_config.json).
pub fn is_model_file(name: &str) -> bool {
    use super::checkpoint::ModelExtras;
    ["config.json", "model.safetensors", ModelExtras::GENERATION_CONFIG].contains(&name)
        || zerostream_checkpoints::DataTokenizer::FILE_NAMES.contains(&name)
}

/// Whether `name` is a file a file browser leaves in a folder it shows (Finder's `.DS_Store` and `._*`
/// files, Explorer's `Thumbs.db` and `desktop.ini`): a directory looked at is still the run's.
pub fn is_browser_litter(name: &str) -> bool {
    name == ".DS_Store" || name.starts_with("._") || name.eq_ignore_ascii_case("Thumbs.db") || name.eq_ignore_ascii_case("desktop.ini")
}

/// `--save DIR`: refused unless it is new or a model directory (so replacing it loses nothing else), and
/// unless its parent accepts the directory it is written into first.
pub fn check_save_dir(save: &Path) -> Result<()> {
    if save.exists() {
        if !save.is_dir() {
            bail!("--save {}: exists and is not a directory", save.display());
        }
        let entries = std::fs::read_dir(save).with_context(|| format!("--save {}: cannot list it", save.display()))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_model_file(&name) && !is_browser_litter(&name) {
                bail!(
                    "--save {} holds {name}, which is not part of a model: saving replaces the whole directory; choose a new or empty one",
                    save.display()
                );
            }
        }
    }
    let partial = super::checkpoint::save_partial_dir(save)?;
    zerostream_checkpoints::checkpoint::create_parent_dir("--save", save)?;
    // A probe now rather than an error after the whole run; named for this process, since every rank
    // of an MPI launch probes at once (a shared name raced: one rank removed the other's probe).
    let mut probe = partial.into_os_string();
    probe.push(format!(".probe-{}", std::process::id()));
    let probe = PathBuf::from(probe);
    std::fs::create_dir(&probe)
        .with_context(|| format!("--save {}: cannot write {} (is it writable?)", save.display(), probe.display()))?;
    std::fs::remove_dir(&probe).with_context(|| format!("removing {}", probe.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--save` replaces a model directory, one a file browser has looked at included, and refuses one
    /// holding anything else, naming it: the replacement would remove it.
    #[test]
    fn save_replaces_only_a_model_directory() {
        let dir = tempfile::tempdir().unwrap();
        let save = dir.path().join("model");
        std::fs::create_dir(&save).unwrap();
        for name in ["config.json", "model.safetensors", ".DS_Store", "Thumbs.db"] {
            std::fs::write(save.join(name), "x").unwrap();
        }
        check_save_dir(&save).unwrap();
        std::fs::write(save.join("notes.txt"), "mine").unwrap();
        let err = check_save_dir(&save).unwrap_err().to_string();
        assert!(err.contains("holds notes.txt, which is not part of a model"), "{err}");
    }
}
