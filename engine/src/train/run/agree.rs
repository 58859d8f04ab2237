//! Under MPI each process reads its own command line and its own files. The trainer holds the ranks
//! to one model and configuration; before anything is written, the ranks here hold each other to the
//! same data (by its tokens, so one path on two machines holding other files is caught) and the same
//! places to write, naming what differs rather than training each rank on other tokens or splitting a
//! checkpoint over two directories.

use anyhow::{Result, bail};
use zerostream_checkpoints::TokenFile;

use super::RunOptions;
use crate::comm::{Comm, fingerprint};

/// Tokens sampled, evenly spread, to fingerprint a token file: every token would read a whole
/// dataset once more on every rank.
const SAMPLED_TOKENS: usize = 4096;

/// Refuses a run whose ranks were given other data, validation or outputs than rank 0 (collective).
pub(super) fn check_ranks_agree(comm: &Comm, options: &RunOptions, tokens: &TokenFile, validation: Option<&TokenFile>) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let c = &options.checkpoints;
    let items = [
        ("--data (the tokens read)", tokens_fingerprint(tokens)?),
        ("--val-data (the tokens read)", validation.map_or(Ok(0), tokens_fingerprint)?),
        ("--eval-every, --eval-batches", fingerprint(format!("{} {}", options.eval_every, options.eval_batches).as_bytes())),
        ("--checkpoint-dir, --checkpoint-every, --keep-checkpoints", fingerprint(format!("{:?} {} {}", c.dir, c.every, c.keep).as_bytes())),
        ("--save, --save-dtype", fingerprint(format!("{:?} {:?}", options.save, options.save_dtype.map(|d| d.flag())).as_bytes())),
        ("--sample-tokens, --prompt", fingerprint(format!("{} {:?}", options.sample_tokens, options.prompt).as_bytes())),
    ];
    let hashes: Vec<u64> = items.iter().map(|(_, hash)| *hash).collect();
    let differing = comm.ranks_differing_each(&hashes)?;
    let differ: Vec<String> = items
        .iter()
        .zip(differing)
        .filter(|(_, ranks)| !ranks.is_empty())
        .map(|((what, _), ranks)| format!("{what} (ranks {ranks:?})"))
        .collect();
    if !differ.is_empty() {
        bail!(
            "the ranks were not given the same {} as rank 0: every rank must get the same flags and see the same files at the \
             same paths",
            differ.join("; ")
        );
    }
    Ok(())
}

/// The token count and [`SAMPLED_TOKENS`] tokens spread over the file, hashed.
fn tokens_fingerprint(tokens: &TokenFile) -> Result<u64> {
    let mut bytes = (tokens.len as u64).to_le_bytes().to_vec();
    let step = tokens.len.div_ceil(SAMPLED_TOKENS).max(1);
    // The last token too: a file cut short and refilled differs at its end.
    for i in (0..tokens.len).step_by(step).chain(tokens.len.checked_sub(1)) {
        bytes.extend(tokens.get(i)?.to_le_bytes());
    }
    Ok(fingerprint(&bytes))
}
