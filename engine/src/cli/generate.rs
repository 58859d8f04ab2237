//! `zerostream generate`: text from a saved model (a Hugging Face directory, a `--save` or a
//! checkpoint), printed as it comes, or one JSON line with `--json`.

use std::io::Write;
use std::path::PathBuf;
use zerostream::words::counted;

use anyhow::{Context, Result, bail};
use zerostream::generate::{DecodePlan, Sampling, generate};
use zerostream::model::Model;
use zerostream_checkpoints::{HfModel, HfTokenizer, TextTokenizer, Tokenizer};

use crate::DeviceArgs;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory: `--save`'s output, a checkpoint's step-NNNNNNNN/ (or the
    /// --checkpoint-dir, meaning the checkpoint its `latest` names), or a download.
    #[arg(long)]
    model: PathBuf,
    /// Text to continue (tokenised with the model directory's tokenizer.json or vocab.json + merges.txt,
    /// else GPT-2's BPE / bytes by the vocabulary size). One of --prompt, --prompt-file and
    /// --prompt-tokens is needed; a text that makes no tokens starts from the begin-of-text token (the
    /// end-of-text token where there is none, as for GPT-2).
    #[arg(long, conflicts_with_all = ["prompt_file", "prompt_tokens"])]
    prompt: Option<String>,
    /// A file whose text to continue.
    #[arg(long, conflicts_with = "prompt_tokens")]
    prompt_file: Option<PathBuf>,
    /// Token ids to continue, comma-separated (e.g. 464,3290,318).
    #[arg(long, value_delimiter = ',')]
    prompt_tokens: Option<Vec<u32>>,
    /// Tokens to generate. Within the model's context each token costs one position's forward (the
    /// key/value cache); past it, each sees the last context-length tokens as a full recompute would, so
    /// each costs a whole window's forward.
    #[arg(long, default_value_t = 100)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 = greedy (always the most likely token).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Sample only among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample only among the most likely tokens that together hold probability p (1 = all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Print one JSON line: {"new_tokens", "ids", "text" (when a tokenizer is known)}.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: DeviceArgs,
    /// Most device memory generation may hold, e.g. 512MiB (default: no limit). The head, the key/value
    /// cache and as many blocks as fit stay on the device; the other blocks are uploaded again for every
    /// token. A budget too small for one token is refused with the numbers.
    #[arg(long, value_parser = crate::parse_size)]
    gpu_mem_budget: Option<u64>,
}

/// The prompt as text (where given as text) and as token ids. A text that makes no tokens starts from
/// the tokenizer's start token ([`TextTokenizer::start_token`]), said; without one it is refused.
fn prompt_of(a: &GenerateArgs, model: &Model, text: Option<&TextTokenizer>) -> Result<(Option<String>, Vec<u32>)> {
    let prompt_text = match (&a.prompt, &a.prompt_file) {
        (Some(p), _) => Some(p.replace("\\n", "\n")),
        (None, Some(f)) => Some(std::fs::read_to_string(f).with_context(|| format!("reading --prompt-file {}", f.display()))?),
        (None, None) => None,
    };
    let prompt: Vec<u32> = match (&a.prompt_tokens, &prompt_text, text) {
        (Some(ids), _, _) => ids.clone(),
        (None, Some(p), Some(t)) => t.encode(p)?,
        (None, Some(_), None) => bail!(
            "no tokenizer for this model (vocab_size {}, no tokenizer.json or vocab.json + merges.txt in {}): give --prompt-tokens",
            model.vocab_size(),
            a.model.display()
        ),
        (None, None, _) => bail!("give --prompt TEXT, --prompt-file FILE or --prompt-tokens ID,ID,..."),
    };
    let prompt = match (prompt.is_empty(), text.and_then(TextTokenizer::start_token)) {
        (false, _) => prompt,
        (true, Some((id, word))) => {
            eprintln!("note: the prompt makes no tokens: starting from the tokenizer's start token {word:?} (id {id})");
            vec![id]
        }
        (true, None) => bail!(
            "the prompt makes no tokens and this tokenizer has no begin- or end-of-text token to start from: give text or --prompt-tokens"
        ),
    };
    // Words the vocabulary lacks reach the model as its unknown token: say so, or they pass unseen.
    if let (Some(TextTokenizer::Hf(t)), Some(_), None) = (text, &prompt_text, &a.prompt_tokens)
        && let Some((token, id)) = t.unknown_token()
        && let unknown = prompt.iter().filter(|&&p| p == id).count()
        && unknown > 0
    {
        let are = if unknown == 1 { "is" } else { "are" };
        eprintln!(
            "warning: {unknown} of the prompt's {} {are} {token}: words this model's tokenizer lacks",
            counted(prompt.len() as u64, "token")
        );
    }
    Ok((prompt_text, prompt))
}

/// `quiet`: the text only, without the device, model and plan lines.
pub fn run(mut a: GenerateArgs, quiet: bool) -> Result<()> {
    // A checkpoint root means its latest checkpoint's model.
    a.model = zerostream::checkpoints::checkpoint::model_dir(&a.model)?;
    // The flags first: a bad one is refused before the model loads or the prompt is printed.
    let sampling = Sampling { max_new_tokens: a.max_new_tokens, temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.check()?;
    let hf = HfModel::open(&a.model)?;
    let model = Model::of_hf(&hf)?;
    if let Some(warning) = model.unused_tensors_warning(&hf) {
        eprintln!("{warning}");
    }
    let text = match HfTokenizer::from_model_dir(&a.model)? {
        Some(t) => Some(TextTokenizer::Hf(t)),
        None => Tokenizer::for_vocab(model.vocab_size()).map(TextTokenizer::Builtin),
    };
    let (prompt_text, prompt) = prompt_of(&a, &model, text.as_ref())?;
    let dev = zerostream::device::open(a.device.device, a.device.adapter.as_deref(), a.gpu_mem_budget)?;
    if !quiet {
        eprintln!("device: {}; model: {}", dev.describe(), model.describe());
    }
    let mut load = zerostream::generate::hf_group_loader(&hf, &model);
    // The prompt is printed once the plan is made: a budget refused leaves nothing on stdout.
    let on_plan = |p: &DecodePlan| {
        if !quiet {
            eprintln!("generate: {}", p.describe())
        }
        if !a.json
            && let Some(p) = &prompt_text
        {
            print!("{p}");
        }
    };
    // Printed as they come: the text of all new tokens so far, minus what was printed (a character
    // can span tokens). Decoded after the prompt, so what joins them (a word-level tokenizer's space)
    // is printed too.
    let mut all = prompt.clone();
    let mut printed = 0;
    let prompt_decoded = text.as_ref().map(|t| t.decode(&prompt));
    let mut on_token = |id: u32| {
        all.push(id);
        if a.json {
            return;
        }
        match (&text, &prompt_decoded) {
            (Some(t), Some(before)) => {
                let whole = t.decode(&all);
                let so_far = match whole.strip_prefix(before.as_str()) {
                    Some(after) => after.to_string(),
                    None => t.decode(&all[prompt.len()..]),
                };
                if so_far.len() > printed && !so_far.ends_with('\u{FFFD}') {
                    print!("{}", &so_far[printed..]);
                    printed = so_far.len();
                }
            }
            _ => print!("{id} "),
        }
        let _ = std::io::stdout().flush();
    };
    let ids = match &dev {
        zerostream::device::AnyDevice::Cpu(d) => generate(d, &model, &mut load, &prompt, &sampling, on_plan, &mut on_token)?,
        zerostream::device::AnyDevice::Gpu(d) => generate(d, &model, &mut load, &prompt, &sampling, on_plan, &mut on_token)?,
    };
    if let Some(note) = zerostream::generate::window_stop_note(&model, sampling.max_new_tokens, ids.len()) {
        eprintln!("{note}");
    }
    if a.json {
        let mut line = serde_json::json!({ "new_tokens": ids.len(), "ids": ids });
        if let Some(t) = &text {
            line["text"] = t.decode(&ids).into();
        }
        println!("{line}");
    } else {
        println!();
    }
    Ok(())
}
