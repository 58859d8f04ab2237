//! No import circles between the source files of any crate: the graph of `use crate::…` and
//! `super::…` paths between files (a path resolved to the deepest module file it names; a child's
//! imports from its own ancestors, which re-export, left out) has no cycle, every module's file where
//! Rust looks for it (no `#[path]`, whose `super::` the scan would misread). A newcomer can then read
//! each crate bottom-up, every file after the files it uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A file's module path under `src`: `device/gpu.rs` -> ["device", "gpu"]; `lib.rs`, `main.rs` -> [].
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
        parts.pop();
    }
    parts
}

/// The file of the deepest module `parts` names (the rest of the path is items inside it).
fn module_file(src: &Path, parts: &[String]) -> Option<PathBuf> {
    (0..=parts.len()).rev().find_map(|i| {
        if i == 0 {
            return Some(src.join("lib.rs")).filter(|p| p.is_file());
        }
        let base = parts[..i].iter().fold(src.to_path_buf(), |p, s| p.join(s));
        [base.with_extension("rs"), base.join("mod.rs")].into_iter().find(|p| p.is_file())
    })
}

/// `crate::…` and `super::…` paths in `code`, with `use` braces expanded (`a::{b, c::d}`).
fn paths(code: &str) -> Vec<String> {
    fn expand(path: &str, out: &mut Vec<String>) {
        let Some(open) = path.find('{') else { return out.push(path.to_string()) };
        let (prefix, body) = (&path[..open], &path[open + 1..path.rfind('}').unwrap_or(path.len())]);
        let (mut depth, mut start) = (0, 0);
        for (i, ch) in body.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&format!("{prefix}{}", &body[start..i]), out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&format!("{prefix}{}", &body[start..]), out);
    }
    let mut out = Vec::new();
    for statement in code.split(';') {
        let statement: String = statement.split_whitespace().collect();
        if let Some(at) = statement.find("use") {
            let path = &statement[at + 3..];
            if path.starts_with("crate::") || path.starts_with("super::") {
                expand(path, &mut out);
                continue;
            }
        }
        // Paths written inline (`crate::device::open(…)`).
        for (at, _) in statement.match_indices("crate::").chain(statement.match_indices("super::")) {
            let path: String = statement[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            out.push(path);
        }
    }
    out
}

/// Each file's imports of other files of the crate under `src`.
fn graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut edges = BTreeMap::new();
    for file in files {
        let own = module_path(src, &file);
        let text = std::fs::read_to_string(&file).unwrap();
        // Code only: comments dropped, and a trailing `#[cfg(test)] mod tests` (its `use super::*`).
        let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        let code = code.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        // A module loaded through `#[path]` lives where its file's place does not say: the scan
        // would read its `super::` as another module's, and miss its circles.
        assert!(!code.contains("#[path"), "{}: a module loaded through #[path]: move its file where Rust looks for it", file.display());
        let mut targets = BTreeSet::new();
        for path in paths(code) {
            let mut parts: Vec<String> = path.split("::").map(str::to_string).collect();
            let mut base = Vec::new();
            if parts[0] == "super" {
                base = own.clone();
                while parts.first().is_some_and(|p| p == "super") {
                    base.pop();
                    parts.remove(0);
                }
            } else {
                parts.remove(0);
            }
            parts.retain(|p| !p.is_empty() && p != "self" && p != "*");
            let Some(target) = module_file(src, &[base, parts].concat()) else { continue };
            let target_path = module_path(src, &target);
            // A module's own ancestors re-export for it: not an import between siblings.
            if target != file && !own.starts_with(&target_path) {
                targets.insert(target);
            }
        }
        edges.insert(file, targets);
    }
    edges
}

/// The cycles of `edges` (strongly connected components of more than one file).
fn cycles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    let reach = |from: &PathBuf| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(f) = stack.pop() {
            for t in edges.get(&f).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    stack.push(t.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&PathBuf, BTreeSet<PathBuf>> = edges.keys().map(|f| (f, reach(f))).collect();
    let mut found: Vec<Vec<PathBuf>> = Vec::new();
    for (f, r) in &reached {
        if !r.contains(*f) || found.iter().any(|c| c.contains(f)) {
            continue;
        }
        found.push(reached.iter().filter(|(g, rg)| r.contains(**g) && rg.contains(*f)).map(|(g, _)| (*g).clone()).collect());
    }
    found
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let (mut report, mut imports) = (Vec::new(), 0);
    for krate in ["engine", "offload", "checkpoints", "shaders"] {
        let src = root.join(krate).join("src");
        let edges = graph(&src);
        imports += edges.values().map(BTreeSet::len).sum::<usize>();
        for cycle in cycles(&edges) {
            let names: Vec<String> = cycle.iter().map(|f| f.strip_prefix(root).unwrap().display().to_string()).collect();
            report.push(names.join(" <-> "));
        }
    }
    assert!(imports > 100, "the scan found only {imports} imports between files: is it reading the sources?");
    assert!(report.is_empty(), "import circles (move the shared name to where it belongs):\n{}", report.join("\n"));
}

#[test]
fn the_scan_sees_a_circle_when_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::{Thing, other::More};\n").unwrap();
    std::fs::write(src.join("b.rs"), "pub fn f() { super::c::g() }\n").unwrap();
    std::fs::write(src.join("c.rs"), "use crate::a::X;\n// use crate::b::Y; (a comment)\n").unwrap();
    let edges = graph(src);
    assert_eq!(cycles(&edges).len(), 1, "{edges:?}");
    std::fs::write(src.join("c.rs"), "use std::fmt;\n").unwrap();
    assert!(cycles(&graph(src)).is_empty());
}
