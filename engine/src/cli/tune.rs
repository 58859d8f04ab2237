//! `zerostream tune`: the fp32 matmul's, the training attention kernels' and (where the adapter has
//! cooperative matrices) the cooperative-matrix matmul's variants timed on this adapter per shape class,
//! and the winners written where the gpu device finds them when it opens (the library's `tune` module
//! does the work).

use anyhow::Result;
use zerostream::bench::tune::{AttentionResult, ClassResult, DownloadResult, Spent, TuneConfig, UploadResult, VariantTimes};
use zerostream::device::GpuDevice;
use zerostream_shaders::{AttentionTile, CoopTile, MatmulTile};

#[derive(clap::Args)]
pub struct TuneArgs {
    /// Which wgpu adapter: its index or part of its name, as `zerostream devices` lists them.
    #[arg(long)]
    adapter: Option<String>,
    /// Model shapes whose products and attention are tuned, comma-separated: GPT-2 presets (gpt2, gpt2-medium,
    /// gpt2-large, gpt2-xl), Llama presets (llama-3.2-1b, llama-3.2-3b, llama-3-8b) or tiny.
    #[arg(long, value_delimiter = ',', default_value = "gpt2,gpt2-xl,llama-3.2-1b")]
    models: Vec<String>,
    /// B: sequences per micro-batch of the runs to tune for (M of most products is B x T).
    #[arg(long, default_value_t = 4, value_parser = crate::positive_count())]
    batch_size: usize,
    /// T: tokens per sequence.
    #[arg(long, default_value_t = 1024, value_parser = crate::positive_count())]
    seq_len: usize,
    /// Rows of the vocabulary chunk, as `train --vocab-chunk-rows`.
    #[arg(long, default_value_t = 8192, value_parser = crate::positive_count())]
    vocab_chunk_rows: usize,
    /// Leave out the products with 16-bit weights (they serve `--precision bf16|fp16` runs).
    #[arg(long)]
    no_16bit: bool,
    /// Only these fp32 matmul variants, comma-separated (e.g. 128x128x8/8x8/db/v4), each timed on every
    /// class. Default: every one the adapter can run, where a variant slower than 3x its class's best on
    /// each of the first 6 classes is not timed on later classes like them (one of their operand layouts,
    /// and M, N and K each within the range all of them span; on an unlike class every variant is timed
    /// again). The
    /// cooperative-matrix variants, which this flag does not name, are always pruned that way.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Only these attention variants (rows of a tile per workgroup, and rows per invocation after an x:
    /// the register-blocked kernels), comma-separated (e.g. rows32,rows8,rows32x4); the untuned variant
    /// (rows32x4, the baseline) and the default (rows32, the reference bits) are timed too. Default:
    /// every one the adapter can run.
    #[arg(long, value_delimiter = ',')]
    attention_variants: Vec<String>,
    /// Leave out the attention kernels (forward and backward at each model's head dim and --seq-len).
    #[arg(long)]
    no_attention: bool,
    /// Leave out the cooperative-matrix matmul's variants (`train --matmul-inputs f16`), which are tuned on
    /// the same products after the fp32 ones where the adapter has cooperative matrices.
    #[arg(long)]
    no_coop: bool,
    /// Leave the upload staging and the read-back as they were. Otherwise tune first times a 256 MiB
    /// write (16 MiB with --quick) through the upload ring's two kinds of staging memory, wgpu's
    /// mappable buffers and host memory the GPU's copy engine reads (Vulkan only), then a read of the
    /// same size into a mapped buffer and into pinned host memory (Vulkan only), and keeps the faster of
    /// each (host or pinned memory only when at least 5% faster: a tie goes to the mapped buffers every
    /// adapter has): a training run's uploads and gradient read-backs then use them.
    #[arg(long)]
    no_upload: bool,
    /// Stop after this many seconds: the classes done are kept and merged into the table, one still being
    /// timed is left untuned (the clock is read before each variant, whose compiling can take minutes on a
    /// CPU driver). Where the adapter has cooperative matrices the fp32 classes stop at 60% of it and
    /// theirs take the rest. The upload and read-back timings come first and, once started, run to their
    /// end (a few seconds on a GPU, longer on a CPU driver: --quick copies 16 MiB rather than 256), so
    /// the whole can overrun a small budget.
    #[arg(long, default_value_t = 170.0, value_parser = crate::parse_seconds)]
    max_seconds: f64,
    /// The tiny model's shapes at B=2 T=64 in place of --models, --batch-size, --seq-len and
    /// --vocab-chunk-rows: seconds on a software adapter such as lavapipe.
    #[arg(long, conflicts_with_all = ["models", "batch_size", "seq_len", "vocab_chunk_rows"])]
    quick: bool,
    /// Print the results without writing the table.
    #[arg(long)]
    no_save: bool,
    /// One JSON object per shape class and a summary, instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: TuneArgs) -> Result<i32> {
    let dev = GpuDevice::open(args.adapter.as_deref(), None)?;
    let mut cfg = if args.quick {
        TuneConfig::quick()
    } else {
        TuneConfig {
            models: args.models.clone(),
            batch: args.batch_size,
            seq_len: args.seq_len,
            vocab_chunk_rows: args.vocab_chunk_rows,
            with_16bit: true,
            max_seconds: 0.0, // set below, for --quick too
            variants: Vec::new(),
            attention: true,
            attention_variants: Vec::new(),
            coop: true,
        }
    };
    cfg.max_seconds = args.max_seconds;
    cfg.attention &= !args.no_attention;
    cfg.coop &= !args.no_coop;
    cfg.attention_variants =
        args.attention_variants.iter().map(|v| AttentionTile::parse(v).map_err(anyhow::Error::msg)).collect::<Result<_>>()?;
    cfg.with_16bit &= !args.no_16bit;
    cfg.variants = args.variants.iter().map(|v| MatmulTile::parse(v).map_err(anyhow::Error::msg)).collect::<Result<_>>()?;
    let summary = dev.summary().clone();
    let variants = if cfg.variants.is_empty() { dev.matmul_variants() } else { cfg.variants.clone() };
    let attention_variants = if cfg.attention { zerostream::bench::tune::attention_variants(&dev, &cfg)?.len() } else { 0 };
    let coop_variants = if cfg.coop { dev.coop_variants().len() } else { 0 };
    eprintln!(
        "tune: {} ({}), {} matmul, {attention_variants} attention and {coop_variants} cooperative-matrix variants, models {} at B={} T={}, timer {}",
        summary.name,
        summary.driver,
        variants.len(),
        cfg.models.join(","),
        cfg.batch,
        cfg.seq_len,
        dev.best_timer().name()
    );
    if !args.no_save {
        zerostream::bench::tune::check_table_place(&dev)?;
    }
    let start = std::time::Instant::now();
    // The upload staging first: a few seconds, counted in --max-seconds (0 tunes nothing, this neither).
    let upload_bytes = if args.quick { 16 << 20 } else { 256 << 20 };
    let time_upload = !args.no_upload && args.max_seconds > 0.0;
    let upload = if time_upload { Some(zerostream::bench::tune::tune_upload(&dev, upload_bytes)?) } else { None };
    if let Some(u) = &upload {
        print_upload(u, args.json);
    }
    // Each copy timing runs to its end once started: the read-back's is not started past the budget.
    let time_download = time_upload && start.elapsed().as_secs_f64() < args.max_seconds;
    if time_upload && !time_download {
        eprintln!("tune: the upload's timing used --max-seconds {}: read-backs not timed", args.max_seconds);
    }
    let download = if time_download { Some(zerostream::bench::tune::tune_download(&dev, upload_bytes)?) } else { None };
    if let Some(d) = &download {
        print_download(d, args.json);
    }
    // The attention classes first: a few, each timed in seconds at most, which the many matmul classes
    // would otherwise leave past --max-seconds.
    let attention = zerostream::bench::tune::tune_attention(&dev, &cfg, start, |r| print_attention(r, args.json))?;
    let results = zerostream::bench::tune::tune(&dev, &cfg, start, |r| print_class(r, "class", args.json))?;
    let coop = zerostream::bench::tune::tune_coop(&dev, &cfg, start, |r| print_class(r, "coop_class", args.json))?;
    let path = if args.no_save {
        None
    } else {
        Some(zerostream::bench::tune::save_table(&dev, &results, &attention, &coop, upload.as_ref(), download.as_ref())?)
    };
    let mismatched = mismatched_variants(&results, &coop, &attention);
    let seconds = start.elapsed().as_secs_f64();
    let tuned = Tuned { results: &results, attention: &attention, coop: &coop, path: path.as_deref(), seconds, mismatched: &mismatched };
    tuned.print_summary(&dev, args.json);
    for m in &mismatched {
        eprintln!("error: {m} gave other bits than the plain default variant (left out of the table): a bug in the template");
    }
    Ok(if mismatched.is_empty() { 0 } else { 1 })
}

/// Every variant whose bits differed from its class's baseline, named with its class.
fn mismatched_variants(results: &[ClassResult], coop: &[ClassResult<CoopTile>], attention: &[AttentionResult]) -> Vec<String> {
    let named = |what: &'static str| move |(v, class): (String, String)| format!("{what} {v} on {class}");
    let of = |timed: Vec<(String, String)>, what| timed.into_iter().map(named(what)).collect::<Vec<_>>();
    let matmul = results.iter().flat_map(|r| r.timed.mismatched.iter().map(|v| (v.to_string(), r.class.key()))).collect();
    let coop = coop.iter().flat_map(|r| r.timed.mismatched.iter().map(|v| (v.to_string(), r.class.key()))).collect();
    let attention = attention.iter().flat_map(|r| r.timed.mismatched.iter().map(|v| (v.to_string(), r.class.key()))).collect();
    [of(matmul, "matmul variant"), of(coop, "cooperative matmul variant"), of(attention, "attention variant")].concat()
}

/// What a tune did, for its closing summary.
struct Tuned<'a> {
    results: &'a [ClassResult],
    attention: &'a [AttentionResult],
    coop: &'a [ClassResult<CoopTile>],
    path: Option<&'a std::path::Path>,
    seconds: f64,
    mismatched: &'a [String],
}

impl Tuned<'_> {
    /// The summary: one JSON object, or the class counts and where the table went.
    fn print_summary(&self, dev: &GpuDevice, json: bool) {
        let (summary, seconds) = (dev.summary(), self.seconds);
        let speedups: Vec<f64> = self.results.iter().map(|r| r.timed.default_seconds() / r.timed.best().1).collect();
        let sum = |spent: &mut dyn Iterator<Item = Spent>| spent.fold(Spent::default(), Spent::plus);
        let (matmul, coop) = (sum(&mut self.results.iter().map(|r| r.timed.spent)), sum(&mut self.coop.iter().map(|r| r.timed.spent)));
        let attention = sum(&mut self.attention.iter().map(|r| r.timed.spent));
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "kind": "summary", "adapter": summary.name, "driver": summary.driver, "timer": dev.best_timer().name(),
                    "classes": self.results.len(), "attention_classes": self.attention.len(), "coop_classes": self.coop.len(),
                    "seconds": seconds, "table": self.path.map(|p| p.display().to_string()),
                    "mismatched": self.mismatched,
                    "speedup_min": speedups.iter().copied().fold(f64::INFINITY, f64::min),
                    "speedup_max": speedups.iter().copied().fold(0.0, f64::max),
                    "spent": {"matmul": spent_json(matmul), "attention": spent_json(attention), "coop": spent_json(coop)},
                })
            );
            return;
        }
        println!(
            "tune: {} matmul, {} attention and {} cooperative-matrix shape classes in {}",
            self.results.len(),
            self.attention.len(),
            self.coop.len(),
            zerostream::words::seconds(seconds)
        );
        for (what, s) in [("matmul", matmul), ("attention", attention), ("cooperative-matrix", coop)] {
            if s.total_s() > 0.0 {
                let secs = zerostream::words::seconds;
                println!(
                    "  {what}: {} making operands, {} first runs and bit checks, {} timed runs",
                    secs(s.setup_s),
                    secs(s.check_s),
                    secs(s.timing_s)
                );
            }
        }
        match self.path {
            Some(p) => println!("table: {} (every later run on this adapter and driver uses it)", p.display()),
            None => println!("table: not written (--no-save)"),
        }
    }
}

/// The JSON fields every tuned class has: its best variant and time, the default's, and every variant's.
fn timed_fields<V: Copy + std::fmt::Display>(t: &VariantTimes<V>) -> serde_json::Map<String, serde_json::Value> {
    let (best, best_s) = t.best();
    let times: Vec<_> = t.times.iter().map(|(v, s)| serde_json::json!({"variant": v.to_string(), "seconds": s})).collect();
    let fields = serde_json::json!({
        "best": best.to_string(), "best_seconds": best_s, "default_seconds": t.default_seconds(),
        "speedup": t.default_seconds() / best_s, "variants": times,
        "mismatched": t.mismatched.iter().map(|v| v.to_string()).collect::<Vec<_>>(),
        "spent": spent_json(t.spent),
    });
    match fields {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// Where the time went, as JSON seconds.
fn spent_json(s: Spent) -> serde_json::Value {
    serde_json::json!({"setup_s": s.setup_s, "check_s": s.check_s, "timing_s": s.timing_s})
}

/// One tuned matmul class (`kind`: `class` for the fp32 kernel, `coop_class` for the cooperative-matrix one).
fn print_class<V: Copy + std::fmt::Display>(r: &ClassResult<V>, kind: &str, json: bool) {
    let (best, best_s) = r.timed.best();
    let s = &r.shape;
    if json {
        let mut row = timed_fields(&r.timed);
        row.extend([
            ("kind".into(), kind.into()),
            ("class".into(), r.class.key().into()),
            ("shape".into(), format!("M={} N={} K={}", s.m, s.n, s.k).into()),
            ("products".into(), r.products.clone().into()),
            ("best_gflops".into(), (r.flops() / best_s / 1e9).into()),
        ]);
        println!("{}", serde_json::Value::Object(row));
        return;
    }
    println!(
        "{}{:<20} M={:<6} N={:<6} K={:<6} best {:<22} {:>9.3} ms {:>8.0} GFLOP/s  default {:>9.3} ms  {:.2}x  [{}]",
        if kind == "coop_class" { "coop " } else { "" },
        r.class.key(),
        s.m,
        s.n,
        s.k,
        best.to_string(),
        best_s * 1e3,
        r.flops() / best_s / 1e9,
        r.timed.default_seconds() * 1e3,
        r.timed.default_seconds() / best_s,
        r.products.join(", ")
    );
}

fn print_attention(r: &AttentionResult, json: bool) {
    let (best, best_s) = r.timed.best();
    if json {
        let mut row = timed_fields(&r.timed);
        row.extend([
            ("kind".into(), "attention_class".into()),
            ("class".into(), r.class.key().into()),
            ("shape".into(), r.shape().into()),
            ("calls".into(), r.calls.clone().into()),
        ]);
        println!("{}", serde_json::Value::Object(row));
        return;
    }
    println!(
        "{:<20} {:<27} best {:<22} {:>9.3} ms  default {:>9.3} ms  {:.2}x  [{}]",
        r.class.key(),
        r.shape(),
        best.name(),
        best_s * 1e3,
        r.timed.default_seconds() * 1e3,
        r.timed.default_seconds() / best_s,
        r.calls.join(", ")
    );
}

/// The upload staging's timing and choice.
fn print_upload(u: &UploadResult, json: bool) {
    let other = LinkTiming { name: "host", label: "host memory", gbps: u.host_gbps, unavailable: &u.host_unavailable };
    print_link_choice(("upload", "upload staging", "writes"), u.bytes, u.mapped_gbps, other, u.chosen.name(), json);
}

/// The read-back's timing and choice.
fn print_download(d: &DownloadResult, json: bool) {
    let other = LinkTiming { name: "pinned", label: "pinned host memory", gbps: d.pinned_gbps, unavailable: &d.pinned_unavailable };
    print_link_choice(("download", "read-back", "reads"), d.bytes, d.mapped_gbps, other, d.chosen.name(), json);
}

/// The timing of the alternative to wgpu's mapped buffers: its JSON key prefix and words, and its rate
/// or why the adapter has none.
struct LinkTiming<'a> {
    name: &'static str,
    label: &'static str,
    gbps: Option<f64>,
    unavailable: &'a Option<String>,
}

/// One link's timing and choice as a JSON row (`kind`, `mapped_gbps`, `<name>_gbps`,
/// `<name>_unavailable`, `chosen`), or a line; `(kind, title, what)` name the link and its copies.
fn print_link_choice((kind, title, what): (&str, &str, &str), bytes: u64, mapped_gbps: f64, other: LinkTiming, chosen: &str, json: bool) {
    if json {
        let mut row = serde_json::Map::new();
        row.insert("kind".into(), kind.into());
        row.insert("bytes".into(), bytes.into());
        row.insert("mapped_gbps".into(), mapped_gbps.into());
        row.insert(format!("{}_gbps", other.name), serde_json::json!(other.gbps));
        row.insert(format!("{}_unavailable", other.name), serde_json::json!(other.unavailable));
        row.insert("chosen".into(), chosen.into());
        println!("{}", serde_json::Value::Object(row));
        return;
    }
    let margin_pct = (zerostream::bench::tune::HOST_MARGIN - 1.0) * 100.0;
    let rate = match (other.gbps, other.unavailable) {
        (Some(g), _) if chosen == "mapped" && g > mapped_gbps => {
            format!("{g:.1} GB/s (not {margin_pct:.0}% faster: a tie goes to mapped buffers)")
        }
        (Some(g), _) => format!("{g:.1} GB/s"),
        (None, Some(why)) => format!("unavailable ({why})"),
        (None, None) => "unavailable".into(),
    };
    println!("{title}: mapped buffers {mapped_gbps:.1} GB/s, {} {rate} for {} MiB {what}: {chosen} chosen", other.label, bytes >> 20);
}
