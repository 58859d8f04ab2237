//! The model seam holds: outside `engine/src/model/`, no engine code names a model family. The trainer,
//! plan, layout, checkpoints, eval and the command line work from `model::Model` alone, so adding a
//! family touches `model/` (its module and a `Model` variant), its kernels and its golden test.
//! `bench/kernels/` and `bench/tune*` are the exceptions, by design: they time kernels at each family's
//! shapes from its preset configurations, without a model.

use std::path::Path;

const FAMILY_NAMES: &[&str] = &["gpt2::", "Gpt2", "llama::", "Llama"];
/// Paths under engine/src/ that may name a family.
const EXEMPT: &[&str] = &["model", "bench/kernels", "bench/tune.rs", "bench/tune"];

fn scan(src: &Path, dir: &Path, offenders: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let under_src = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
        if EXEMPT.contains(&under_src.as_str()) {
            continue;
        }
        if path.is_dir() {
            scan(src, &path, offenders);
        } else if name.ends_with(".rs") {
            for (i, line) in std::fs::read_to_string(&path).unwrap().lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if let Some(family) = FAMILY_NAMES.iter().find(|f| code.contains(*f)) {
                    offenders.push(format!("{}:{}: names {family}: {}", path.display(), i + 1, line.trim()));
                }
            }
        }
    }
}

#[test]
fn no_engine_module_outside_model_names_a_family() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    scan(&src, &src, &mut offenders);
    assert!(offenders.is_empty(), "model families named outside engine/src/model/:\n{}", offenders.join("\n"));
    // The scan does look: the model module itself names its family.
    let mut inside = Vec::new();
    scan(&src.join("model"), &src.join("model"), &mut inside);
    assert!(!inside.is_empty());
}
