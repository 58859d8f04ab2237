//! 01: evaluate a Hugging Face GPT-2 directory on a token file, through the library.
//!
//! Shows: opening a device (`auto` takes a real GPU if there is one, else the cpu device), loading a
//! model and computing the mean loss of the training contract's first micro-batches.
//! Run: `cargo run -p zerostream-examples --example 01_eval_golden [MODEL_DIR TOKENS]`
//! (defaults to the tiny GPT-2 kept in engine/tests/golden).

use std::path::PathBuf;

use zerostream::device::{self, DeviceChoice};

fn main() -> anyhow::Result<()> {
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/golden/gpt2-tiny");
    let mut args = std::env::args().skip(1);
    let model = args.next().map(PathBuf::from).unwrap_or(golden.join("model"));
    let tokens = args.next().map(PathBuf::from).unwrap_or(golden.join("tokens.bin"));

    let dev = device::open(DeviceChoice::Auto, None, None)?;
    println!("device: {}", dev.describe());
    let report = zerostream::evaluate_on(
        &dev,
        &model,
        &zerostream::EvalData {
            path: &tokens,
            dtype: zerostream::checkpoints::TokenWidth::U16,
            batch: 4,
            seq_len: 16,
            batches: 4,
            progress: true,
        },
    )?;
    println!("mean loss over {} tokens: {:.6} ({:.0} tokens/s)", report.tokens, report.loss, report.tokens as f64 / report.seconds);
    Ok(())
}
