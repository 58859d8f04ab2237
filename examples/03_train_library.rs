//! 03: a training program on the library alone, no command line: the built-in run's small GPT-2 trained
//! on Hamlet in words, a step at a time, with its validation loss on the last scenes and a sample.
//!
//! Shows: `zerostream::prelude` (one dependency line), `Trainer` driven directly (what `run_on` and
//! `zerostream train` do around it: progress, metrics, checkpoints), and generation from its weights.
//! Run: `cargo run --release -p zerostream-examples --example 03_train_library [STEPS]`

use zerostream::prelude::*;

fn train<D: Backend>(dev: &D, steps: u64) -> anyhow::Result<(f64, f64, f64)> {
    // Hamlet in words (a word-level tokenizer made from the play), its last scenes held out.
    let demo = zerostream::train::demo::Demo::get()?;
    let (tokens, validation) = (demo.train_tokens(), demo.val_tokens());

    let model = demo.model(); // 4 layers, 128 wide, one token per word of the play
    let lr = LrPlan { peak: 2e-3, min: 1e-4, warmup_steps: steps / 10, total_steps: steps, schedule: LrSchedule::Cosine };
    let config = TrainConfig { batch: 8, seq_len: 64, steps, lr, ..TrainConfig::default() };
    let mut trainer = Trainer::new(dev, &ModelSource::Random { model: model.clone(), seed: 1337 }, config)?;
    println!("{}", trainer.placement().describe());

    let mut losses = Vec::new();
    while trainer.step() < steps {
        let report = trainer.train_step(&tokens)?;
        if report.step % 10 == 0 {
            println!("step {:>4}: loss {:.4} ({:.0} tokens/s)", report.step, report.loss, report.tokens_per_s());
        }
        losses.push(report.loss);
    }
    let val_loss = trainer.validation_loss(&validation, 4)?;

    // Generation reads the trainer's weights one group at a time.
    let prompt = demo.tokenizer.encode("HAMLET\n")?;
    let ids = zerostream::generate::sample(&model, &mut |g| trainer.master_group(g), &prompt, 60, 0.8, 1337)?;
    println!("validation loss {val_loss:.4}; sample:\n{}", demo.tokenizer.decode(&[prompt, ids].concat()));
    Ok((losses[0], losses[losses.len() - 1], val_loss))
}

fn main() -> anyhow::Result<()> {
    let steps: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(200);
    let (first, last, _) = match device::open(DeviceChoice::Auto, None, None)? {
        AnyDevice::Cpu(d) => train(&d, steps)?,
        AnyDevice::Gpu(d) => train(&d, steps)?,
    };
    println!("loss {first:.3} -> {last:.3}");
    Ok(())
}

/// `cargo test --workspace` runs the example briefly: the loss falls.
#[test]
fn a_few_steps_lower_the_loss() {
    let AnyDevice::Cpu(dev) = device::open(DeviceChoice::Cpu, None, None).unwrap() else { unreachable!() };
    let (first, last, val_loss) = train(&dev, 12).unwrap();
    assert!(last < first && val_loss.is_finite(), "loss {first} -> {last}, validation {val_loss}");
}
