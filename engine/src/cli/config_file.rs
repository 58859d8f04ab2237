//! `train --config-file run.toml` (and `plan`): flags from a TOML file, and the resolved configuration
//! of a run as TOML (which the library writes beside its metrics, `train/outputs.rs`) so it can be repeated.
//!
//! A key is a flag's long name (`batch-size = 8`, `precision = "bf16"`, `recompute = true`); `_` may
//! stand for `-`. Values are what the flag takes on the command line, as a TOML string or number; an
//! on/off flag takes `true` or `false`. The file's flags are placed before the command line's, so a flag
//! given on the command line wins; both count as given for `--resume`. Unknown keys and values of the
//! wrong type are refused with the file, the key and what was expected.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{ArgAction, ArgMatches, Command};

/// The flag naming the file.
pub const FLAG: &str = "config-file";

/// The subcommands that take `--config-file`.
pub const COMMANDS: &[&str] = &["train", "plan"];

/// `argv` with the flags of `sub_matches`' `--config-file` (if given) inserted right after the
/// subcommand `name`, so that the command line's own flags, which follow, win.
pub fn expand_args(argv: Vec<OsString>, name: &str, sub: &Command, sub_matches: &ArgMatches) -> Result<Vec<OsString>> {
    let Some(file) = sub_matches.get_one::<PathBuf>(&FLAG.replace('-', "_")) else { return Ok(argv) };
    let from_file = read(file, sub)?;
    let at = argv.iter().skip(1).position(|a| a == name).context("the subcommand in the arguments")? + 2;
    let mut out = argv[..at].to_vec();
    out.extend(from_file);
    out.extend_from_slice(&argv[at..]);
    Ok(out)
}

/// The flags `file` holds, as command-line arguments of `sub`, each checked on its own.
pub fn read(file: &Path, sub: &Command) -> Result<Vec<OsString>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("--config-file {}: cannot read it", file.display()))?;
    let table: toml::Table = text.parse().map_err(|e| anyhow::anyhow!("--config-file {}: not valid TOML: {e}", file.display()))?;
    let mut args = Vec::new();
    let mut seen: std::collections::BTreeMap<String, &str> = Default::default();
    for (key, value) in &table {
        let name = key.replace('_', "-");
        let at = |what: String| anyhow::anyhow!("--config-file {}: key `{key}`: {what}", file.display());
        // `batch-size` and `batch_size` are one flag: given twice, neither may silently win.
        if let Some(other) = seen.insert(name.clone(), key) {
            bail!(at(format!("--{name} is given twice, also as `{other}`; keep one")));
        }
        let Some(arg) = sub.get_arguments().find(|a| a.get_long() == Some(name.as_str())) else {
            bail!(at(format!("`{}` has no flag --{name} (`zerostream {} --help` lists them)", sub.get_name(), sub.get_name())));
        };
        if name == FLAG {
            bail!(at("a config file cannot name another".into()));
        }
        let flag = format!("--{name}");
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            match value {
                toml::Value::Boolean(true) => args.push(OsString::from(&flag)),
                toml::Value::Boolean(false) => {}
                other => bail!(at(format!("expected true or false (--{name} is an on/off flag), got {}", other.type_str()))),
            }
            continue;
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => bail!(at(format!("expected a string or a number (the value of --{name}), got {}", other.type_str()))),
        };
        // The flag's own parser says what it expects.
        let mut alone = sub.clone().disable_help_flag(true).disable_version_flag(true);
        alone = alone.mut_args(|a| a.required(false));
        if let Err(e) = alone.try_get_matches_from([OsString::from(sub.get_name()), OsString::from(&flag), OsString::from(&text)]) {
            let message = e.render().to_string();
            let first = message.lines().next().unwrap_or_default().trim_start_matches("error: ");
            // The values a choice takes, as the command line's own error lists them.
            let values = message.lines().map(str::trim).find(|l| l.starts_with("[possible values:"));
            bail!(at(values.map_or(first.to_string(), |v| format!("{first} {v}"))));
        }
        args.push(OsString::from(flag));
        args.push(OsString::from(text));
    }
    Ok(args)
}

/// The flags whose values are paths (`config` and `tokenizer` where the value is a file rather than a
/// preset's name): written absolute in the resolved file, so that it repeats the run from any folder.
const PATH_FLAGS: &[&str] = &[
    "model",
    "config",
    "data",
    "val-data",
    "resume",
    "tokenizer",
    "save",
    "metrics",
    "trace",
    "tensorboard",
    "checkpoint-dir",
    "nvme-dir",
    "measure",
];

/// `value` of flag `long` as the resolved file keeps it: a path flag's path made absolute (each of a
/// `listed` flag's comma-separated ones), a preset's name left as it is (`--config gpt2`, `--tokenizer
/// bytes`: taken as the preset before any file of that name, as the run takes them).
fn resolved_value(long: &str, value: String, listed: bool) -> String {
    let preset = match long {
        "config" => zerostream::model::Model::preset(&value).is_some(),
        "tokenizer" => matches!(value.as_str(), "gpt2" | "bytes"),
        _ => false,
    };
    if !PATH_FLAGS.contains(&long) || value.is_empty() || preset {
        return value;
    }
    let absolute = |part: &str| {
        let path = Path::new(part);
        match std::path::absolute(path) {
            Ok(abs) if path.is_relative() => abs.display().to_string(),
            _ => part.to_string(),
        }
    };
    if listed { value.split(',').map(absolute).collect::<Vec<_>>().join(",") } else { absolute(&value) }
}

/// Every flag of `sub` as resolved in `matches` (command line, config file and defaults), as a TOML
/// file `--config-file` repeats the run with, from any folder (paths absolute). Flags not given and
/// without a default are left out.
pub fn resolved(sub: &Command, matches: &ArgMatches) -> String {
    let mut out = format!(
        "# The resolved configuration of a `zerostream {}` run (every flag, given or defaulted).\n\
         # Repeat the run with: zerostream {} --config-file THIS_FILE\n",
        sub.get_name(),
        sub.get_name()
    );
    for arg in sub.get_arguments() {
        let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else { continue };
        if long == FLAG || matches.value_source(id).is_none() {
            continue;
        }
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            toml::Value::Boolean(matches.get_flag(id))
        } else {
            // Every value of a comma-separated flag (`--nvme-dir a,b`), joined as given.
            let values: Vec<String> = matches.get_raw(id).into_iter().flatten().map(|v| v.to_string_lossy().into_owned()).collect();
            if values.is_empty() {
                continue;
            }
            let raw = resolved_value(long, values.join(","), arg.get_value_delimiter() == Some(','));
            // A number only where reading it back gives the same text (see `read`); anything else,
            // including text that merely looks numeric, stays a string.
            match (raw.parse::<i64>(), raw.parse::<f64>()) {
                (Ok(i), _) if i.to_string() == raw => toml::Value::Integer(i),
                (_, Ok(f)) if f.is_finite() && f.to_string() == raw => toml::Value::Float(f),
                _ => toml::Value::String(raw),
            }
        };
        out.push_str(&format!("{long} = {value}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_flags_are_kept_absolute_and_preset_names_as_given() {
        let cwd = std::env::current_dir().unwrap();
        let at = |name: &str| std::path::absolute(cwd.join(name)).unwrap().display().to_string();
        assert_eq!(super::resolved_value("data", "x.bin".into(), false), at("x.bin"));
        assert_eq!(super::resolved_value("data", "run,1.bin".into(), false), at("run,1.bin"), "a comma in one path");
        let abs = at("x.bin");
        assert_eq!(super::resolved_value("data", abs.clone(), false), abs);
        // Presets are taken before files of their names: kept as names, whatever the folder holds.
        assert_eq!(super::resolved_value("config", "gpt2".into(), false), "gpt2");
        assert_eq!(super::resolved_value("config", "tiny.json".into(), false), at("tiny.json"));
        assert_eq!(super::resolved_value("tokenizer", "bytes".into(), false), "bytes");
        assert_eq!(super::resolved_value("lr", "0.1".into(), false), "0.1");
        assert_eq!(super::resolved_value("nvme-dir", "a,b".into(), true), format!("{},{}", at("a"), at("b")));
    }
}
