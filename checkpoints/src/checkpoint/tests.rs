//! The checkpoint root's moves, refusals and pruning, and the paths a resume or `--model` names.

use super::*;

fn fake_checkpoint(root: &CheckpointRoot, step: u64, body: &str) -> PathBuf {
    let p = root.begin(step).unwrap();
    std::fs::write(p.join(STATE_FILE), body).unwrap();
    root.commit(step, &p).unwrap()
}

#[test]
fn commits_move_into_place_update_latest_and_replace_old_copies() {
    let dir = tempfile::tempdir().unwrap();
    let root = CheckpointRoot::open(&dir.path().join("ck"), None).unwrap();
    let a = fake_checkpoint(&root, 1, "one");
    fake_checkpoint(&root, 2, "two");
    assert_eq!(a.file_name().unwrap(), "step-00000001");
    assert_eq!(resolve_resume(&root.dir).unwrap(), root.dir.join("step-00000002"));
    drop(root);
    // Resumed from step 1, the run writes step 2 again: the new copy replaces the old.
    let root = CheckpointRoot::open(&dir.path().join("ck"), Some(a.as_path())).unwrap();
    assert_eq!(root.left_behind, [2]);
    fake_checkpoint(&root, 2, "two again");
    assert_eq!(std::fs::read_to_string(root.dir.join("step-00000002").join(STATE_FILE)).unwrap(), "two again");
    fake_checkpoint(&root, 3, "three");
    let removed = root.prune(2).unwrap();
    assert_eq!(removed, vec![root.dir.join("step-00000001")]);
    let names: Vec<_> = std::fs::read_dir(&root.dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(names.iter().all(|n| !n.ends_with(PARTIAL_SUFFIX)), "{names:?}");
    assert_eq!(list_checkpoints(&root.dir).unwrap().len(), 2);
}

#[test]
fn a_root_with_checkpoints_takes_only_a_run_resumed_from_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    fake_checkpoint(&root, 4, "four");
    drop(root);
    let elsewhere = tempfile::tempdir().unwrap();
    for resumed_from in [None, Some(elsewhere.path().join("step-00000004"))] {
        let err = CheckpointRoot::open(dir.path(), resumed_from.as_deref()).err().unwrap().to_string();
        assert!(err.contains("already holds checkpoints (step-00000004)") && err.contains("--resume"), "{err}");
    }
    assert_eq!(list_checkpoints(dir.path()).unwrap().len(), 1, "nothing removed");
    // The same checkpoint spelt through a relative path.
    let cwd = std::env::current_dir().unwrap();
    let relative = pathdiff(&dir.path().join("step-00000004"), &cwd);
    CheckpointRoot::open(dir.path(), Some(&relative)).unwrap();
}

#[test]
fn a_model_path_that_is_a_root_means_its_latest_and_a_broken_latest_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    let step = fake_checkpoint(&root, 3, "three");
    std::fs::write(step.join("config.json"), "{}").unwrap();
    assert_eq!(model_dir(dir.path()).unwrap(), step);
    assert_eq!(model_dir(&step).unwrap(), step);
    // Not a root: given back for the model's reader to refuse.
    let plain = tempfile::tempdir().unwrap();
    assert_eq!(model_dir(plain.path()).unwrap(), plain.path());
    std::fs::write(dir.path().join(LATEST), "step-00000009\n").unwrap();
    let err = format!("{:#}", model_dir(dir.path()).unwrap_err());
    assert!(err.contains("names step-00000009, which is missing"), "{err}");
    let want = format!("complete checkpoints there: step-00000003 (name one, e.g. {})", step.display());
    assert!(err.contains(&want), "{err}");
    let err = resolve_resume(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&want), "{err}");
}

/// `path` relative to `base` (`../..` up to their common part).
fn pathdiff(path: &Path, base: &Path) -> PathBuf {
    let (path, base) = (path.canonicalize().unwrap(), base.canonicalize().unwrap());
    let common = path.components().zip(base.components()).take_while(|(a, b)| a == b).count();
    let mut out: PathBuf = base.components().skip(common).map(|_| "..").collect();
    out.extend(path.components().skip(common));
    out
}

#[test]
fn pruning_counts_this_runs_line_and_leaves_the_abandoned_one() {
    // Checkpoints 10, 20, 30; resumed from 10, the run saves 17 and 24 with --keep-checkpoints 2.
    let dir = tempfile::tempdir().unwrap();
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    for step in [10, 20, 30] {
        fake_checkpoint(&root, step, "first line");
    }
    drop(root);
    let root = CheckpointRoot::open(dir.path(), Some(&dir.path().join("step-00000010"))).unwrap();
    assert_eq!(root.left_behind, [20, 30]);
    fake_checkpoint(&root, 17, "second line");
    assert_eq!(root.prune(2).unwrap(), Vec::<PathBuf>::new(), "10 and 17 are the line's two");
    fake_checkpoint(&root, 24, "second line");
    assert_eq!(root.prune(2).unwrap(), [dir.path().join("step-00000010")]);
    let steps: Vec<u64> = list_checkpoints(dir.path()).unwrap().into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, [17, 20, 24, 30], "the left-behind 20 and 30 neither counted nor removed");
    assert_eq!(resolve_resume(dir.path()).unwrap(), dir.path().join("step-00000024"), "latest is this run's");
}

#[test]
fn a_second_run_is_refused_and_leftovers_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    let err = CheckpointRoot::open(dir.path(), None).err().unwrap().to_string();
    assert!(err.contains("in use by another zerostream run"), "{err}");
    let interrupted = root.begin(7).unwrap();
    std::fs::write(interrupted.join("model.safetensors"), b"half").unwrap();
    drop(root);
    let root = CheckpointRoot::open(dir.path(), None).unwrap();
    assert_eq!(root.removed_leftovers, vec![interrupted.clone()]);
    assert!(!interrupted.exists());
    let err = resolve_resume(dir.path()).unwrap_err().to_string();
    assert!(err.contains("neither a checkpoint"), "{err}");
}

#[test]
fn manifests_catch_truncation_corruption_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), b"hello world").unwrap();
    let manifest = BTreeMap::from([("a".to_string(), digest_file(&dir.path().join("a")).unwrap())]);
    verify_files(dir.path(), &manifest).unwrap();
    std::fs::write(dir.path().join("a"), b"hello worle").unwrap();
    assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("corrupt"));
    std::fs::write(dir.path().join("a"), b"hello").unwrap();
    assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("truncated"));
    std::fs::remove_file(dir.path().join("a")).unwrap();
    assert!(verify_files(dir.path(), &manifest).unwrap_err().to_string().contains("missing"));
}

/// A copy of `name` under `root`, moved into place through a partial directory without the
/// atomic exchange.
fn publish_portably(root: &Path, name: &str, body: &str) {
    let partial = root.join(format!(".{name}{PARTIAL_SUFFIX}"));
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join(STATE_FILE), body).unwrap();
    publish_dir_by(&partial, &root.join(name), false).unwrap();
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn without_an_exchange_an_old_copy_is_replaced_through_a_name_aside() {
    let dir = tempfile::tempdir().unwrap();
    publish_portably(dir.path(), "step-00000002", "two");
    publish_portably(dir.path(), "step-00000002", "two again");
    assert_eq!(std::fs::read_to_string(dir.path().join("step-00000002").join(STATE_FILE)).unwrap(), "two again");
    assert_eq!(names_in(dir.path()), ["step-00000002"], "nothing aside, nothing partial");
}

/// The steps of the portable replacement, done by hand up to `steps`, as a crash would leave them.
fn interrupted_replacement(root: &Path, steps: usize) {
    let (target, partial) = (root.join("step-00000002"), partial_dir(root, 2));
    std::fs::create_dir(&partial).unwrap();
    std::fs::write(partial.join(STATE_FILE), "new").unwrap();
    let aside = replaced_path(&target).unwrap();
    if steps >= 1 {
        os::rename(&target, &aside).unwrap();
    }
    if steps >= 2 {
        os::rename(&partial, &target).unwrap();
    }
}

#[test]
fn a_crash_between_the_portable_steps_loses_no_saved_checkpoint() {
    // Stopped after moving the old copy aside (the step's name missing), or after the new copy
    // took the name (the old one still aside).
    for (steps, want) in [(1, "old"), (2, "new")] {
        let dir = tempfile::tempdir().unwrap();
        let root = CheckpointRoot::open(dir.path(), None).unwrap();
        fake_checkpoint(&root, 1, "one");
        fake_checkpoint(&root, 2, "old");
        drop(root);
        interrupted_replacement(dir.path(), steps);
        let root = CheckpointRoot::open(dir.path(), Some(&dir.path().join("step-00000001"))).unwrap();
        let step = dir.path().join("step-00000002");
        assert_eq!(std::fs::read_to_string(step.join(STATE_FILE)).unwrap(), want, "after {steps} steps");
        assert_eq!(root.restored.len(), usize::from(steps == 1), "after {steps} steps: {:?}", root.restored);
        assert_eq!(names_in(dir.path()), [".zerostream.lock", "latest", "step-00000001", "step-00000002"], "after {steps} steps");
        assert_eq!(resolve_resume(dir.path()).unwrap(), step, "`latest` names a whole checkpoint");
    }
}

#[test]
fn an_interrupted_replacement_of_a_saved_model_is_settled_by_the_next_save() {
    // `--save DIR` publishes beside DIR, outside any checkpoint root: the next publication settles it.
    let dir = tempfile::tempdir().unwrap();
    publish_portably(dir.path(), "model", "old");
    let target = dir.path().join("model");
    os::rename(&target, &replaced_path(&target).unwrap()).unwrap(); // stopped after step 1
    assert_eq!(restore_replaced(&target).unwrap(), Some(Restored::OldCopyBack));
    assert_eq!(std::fs::read_to_string(target.join(STATE_FILE)).unwrap(), "old");
    publish_portably(dir.path(), "model", "new");
    assert_eq!(std::fs::read_to_string(target.join(STATE_FILE)).unwrap(), "new");
    assert_eq!(names_in(dir.path()), ["model"]);
    assert_eq!(restore_replaced(&target).unwrap(), None, "nothing aside");
}

#[test]
fn step_names_round_trip() {
    assert_eq!(step_name(42), "step-00000042");
    assert_eq!(parse_step_name("step-00000042"), Some(42));
    assert_eq!(parse_step_name("step-42"), None);
    assert_eq!(parse_step_name("step-0000004x"), None);
}

#[test]
fn an_outputs_folder_is_made_and_a_file_in_its_way_is_named() {
    let dir = tempfile::tempdir().unwrap();
    create_parent_dir("--metrics", &dir.path().join("a/b/m.jsonl")).unwrap();
    assert!(dir.path().join("a/b").is_dir());
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let err = create_parent_dir("--metrics", &dir.path().join("file/c/m.jsonl")).unwrap_err().to_string();
    assert!(
        err.starts_with("--metrics ") && err.ends_with(&format!("{} is a file, not a directory", dir.path().join("file").display())),
        "{err}"
    );
    create_parent_dir("--save", Path::new("m")).unwrap();
}
