//! `--grad-compression` with in-process ranks: every mode trains on gpt2-tiny-accum at world 2 with
//! every rank agreeing bit for bit, sends the bytes its codec promises (`comm_grad_bytes` against
//! `none`'s), stays near `none`'s losses, and `none` is today's exchange exactly. The MPI twin of
//! these runs is tests/launch.rs; resume with residuals is tests/checkpoints_resume.rs.

mod common;

use common::trajectory::{Golden, golden_dir};
use zerostream::comm::Comm;
use zerostream::comm::compress::GradCompression;
use zerostream::device::CpuDevice;
use zerostream::train::ranks::in_process;
use zerostream::train::{ModelSource, TrainConfig, Trainer, ZeroStage};
use zerostream_checkpoints::{HfModel, TokenFile};

const GOLDEN: &str = "gpt2-tiny-accum";

struct Steps {
    losses: Vec<f64>,
    norms: Vec<f64>,
    grad_bytes: Vec<u64>,
    param_bytes: Vec<u64>,
    codec_seconds: f64,
    weights: Vec<u32>,
}

fn run(world: usize, tc: TrainConfig) -> Steps {
    let runs = in_process(world, |comm: Comm| {
        let hf = HfModel::open(&golden_dir(GOLDEN).join("model"))?;
        let tokens = TokenFile::open(&golden_dir(GOLDEN).join("tokens.bin"))?;
        let dev = CpuDevice::new(None);
        let mut trainer = Trainer::with_comm(&dev, &ModelSource::Hf(&hf), tc.clone(), comm)?;
        let mut s = Steps {
            losses: Vec::new(),
            norms: Vec::new(),
            grad_bytes: Vec::new(),
            param_bytes: Vec::new(),
            codec_seconds: 0.0,
            weights: Vec::new(),
        };
        for _ in 0..tc.steps {
            let r = trainer.train_step(&tokens)?;
            s.losses.push(r.loss);
            s.norms.push(r.grad_norm);
            s.grad_bytes.push(r.comm.grad_sent_bytes);
            s.param_bytes.push(r.comm.param_sent_bytes);
            s.codec_seconds += r.comm.codec_seconds;
            assert!(r.comm.grad_sent_bytes + r.comm.param_sent_bytes <= r.comm.sent_bytes);
        }
        s.weights = trainer.master_weights()?.iter().flat_map(|(_, _, v)| v.iter().map(|x| x.to_bits())).collect();
        Ok(s)
    })
    .unwrap();
    for (r, other) in runs.iter().enumerate().skip(1) {
        assert!(other.losses == runs[0].losses && other.weights == runs[0].weights, "rank {r} disagrees with rank 0");
    }
    runs.into_iter().next().unwrap()
}

fn config(mode: GradCompression, stage: ZeroStage) -> TrainConfig {
    let base = Golden::load(GOLDEN).train_config();
    TrainConfig { grad_accum: 1, steps: 8, zero_stage: stage, grad_compression: mode, grad_compression_chunk: 64, ..base }
}

#[test]
fn every_mode_sends_what_its_codec_promises_and_stays_near_none() {
    let none = run(2, config(GradCompression::None, ZeroStage::Two));
    // The default is today's exchange, bit for bit.
    let default = run(2, TrainConfig { grad_compression_chunk: 2048, ..config(GradCompression::None, ZeroStage::Two) });
    assert_eq!(default.weights, none.weights);
    assert_eq!(none.codec_seconds, 0.0, "none codes nothing");
    // (mode, the most gradient bytes it may send as a fraction of none's, loss tolerance relative to none's)
    let cases = [
        (GradCompression::Bf16, 0.5, 0.01),
        (GradCompression::Int8, 0.25 + 1.0 / 64.0, 0.02),
        (GradCompression::OneBit, 1.0 / 32.0 + 1.0 / 64.0, 0.10),
        (GradCompression::TopK(0.05), 0.10, 0.10),
    ];
    for (mode, most, tol) in cases {
        let got = run(2, config(mode, ZeroStage::Two));
        let (sent, full): (u64, u64) = (got.grad_bytes.iter().sum(), none.grad_bytes.iter().sum());
        let ratio = sent as f64 / full as f64;
        // Words are padded to 4 bytes per slice: a little slack above the codec's own ratio.
        assert!(ratio <= most * 1.01 + 1e-3 && sent > 0, "{mode}: sent {sent} gradient bytes, {ratio:.4} of none's {full}");
        assert_eq!(got.param_bytes, none.param_bytes, "{mode}: the working copy's exchange is unchanged");
        assert!(got.codec_seconds > 0.0, "{mode}: the coding time is counted");
        let worst = got.losses.iter().zip(&none.losses).map(|(a, b)| (a - b).abs() / b).fold(0.0, f64::max);
        assert!(
            got.losses.iter().all(|l| l.is_finite()) && worst < tol,
            "{mode}: losses {:?} against none's {:?}",
            got.losses,
            none.losses
        );
        assert_ne!(got.weights, none.weights, "{mode}: compression changed nothing");
        println!("{mode}: {ratio:.4} of none's gradient bytes; losses within {worst:.2e} of none's over {} steps", got.losses.len());
    }
}

#[test]
fn compression_works_at_every_stage_and_does_nothing_with_one_rank() {
    // Stage 0 at 3 and 4 ranks: the two-phase all-reduce (its residual's padding: grad_exchange's
    // unit test). One phase would send 0.070 and 0.094 of none's bytes there, over the 1/16 below.
    for (world, stage) in [(2, ZeroStage::Zero), (2, ZeroStage::One), (2, ZeroStage::Three), (3, ZeroStage::Zero), (4, ZeroStage::Zero)] {
        let none = run(world, config(GradCompression::None, stage));
        let got = run(world, config(GradCompression::OneBit, stage));
        let ratio = got.grad_bytes.iter().sum::<u64>() as f64 / none.grad_bytes.iter().sum::<u64>() as f64;
        assert!(ratio < 1.0 / 16.0, "world {world} stage {}: onebit sent {ratio:.4} of none's gradient bytes", stage.number());
        assert_ne!(got.weights, none.weights);
        let worst = got.losses.iter().zip(&none.losses).map(|(a, b)| (a - b).abs() / b).fold(0.0, f64::max);
        assert!(worst < 0.10, "world {world} stage {}: onebit's losses {:?} against none's {:?}", stage.number(), got.losses, none.losses);
        // The codec's output in the groups' padding is dropped: kept, it grew step after step in
        // stage 0 (to 70x none's norm in 10 steps), where the result is sent again.
        let most = none.norms.iter().copied().fold(0.0, f64::max);
        assert!(
            got.norms.iter().all(|&n| n < 2.0 * most),
            "world {world} stage {}: onebit's norms {:?} against none's {:?}",
            stage.number(),
            got.norms,
            none.norms
        );
    }
    // Stage 0 gathers no working copy: onebit's step sends the gradients' encodings alone.
    let zero = run(2, config(GradCompression::OneBit, ZeroStage::Zero));
    assert!(zero.param_bytes.iter().all(|&b| b == 0), "stage 0 sent parameter bytes: {:?}", zero.param_bytes);
    // One rank: nothing crosses, so the run is none's exactly.
    let one = run(1, config(GradCompression::OneBit, ZeroStage::Two));
    let plain = run(1, config(GradCompression::None, ZeroStage::Two));
    assert_eq!(one.weights, plain.weights);
    assert!(one.grad_bytes.iter().all(|&b| b == 0));
}

#[test]
fn bad_modes_and_loss_scaling_are_refused_by_name() {
    for bad in ["gzip", "topk:0", "topk:2"] {
        let err = bad.parse::<GradCompression>().unwrap_err().to_string();
        assert!(err.contains("--grad-compression") && err.contains(bad), "{err}");
    }
    let fp16 = TrainConfig { precision: zerostream::train::Precision::Fp16, ..config(GradCompression::Int8, ZeroStage::Two) };
    let err = fp16.check().unwrap_err().to_string();
    assert!(err.contains("--grad-compression int8") && err.contains("fp16"), "{err}");
    // f16 matmul inputs scale the loss too: the same refusal, naming that flag.
    let f16_inputs =
        TrainConfig { matmul_inputs: zerostream::device::MatmulInputs::F16, ..config(GradCompression::OneBit, ZeroStage::Two) };
    let err = f16_inputs.check().unwrap_err().to_string();
    assert!(err.contains("--grad-compression onebit") && err.contains("--matmul-inputs f16"), "{err}");
    let chunk = TrainConfig { grad_compression_chunk: 0, ..config(GradCompression::Int8, ZeroStage::Two) };
    assert!(chunk.check().unwrap_err().to_string().contains("--grad-compression-chunk"));
}

/// `x` encoded by `codec` and decoded again.
fn round_trip(codec: &zerostream::comm::compress::Codec, x: &[f32]) -> Vec<f32> {
    let mut bytes = vec![0u8; codec.encoded_bytes(x.len())];
    codec.encode(x, &mut bytes);
    let mut y = vec![0.0f32; x.len()];
    codec.decode(&bytes, &mut y);
    y
}

/// The compressed reduce-scatter at world 3, against the same arithmetic done here: each rank's part of
/// another rank's slice decoded from its encoding, its own part exact, summed in rank order; the
/// residual left is what the encoding dropped; the bytes counted are the encodings'.
#[test]
fn the_compressed_reduce_scatter_decodes_and_sums_in_rank_order() {
    use zerostream::comm::compress::Codec;
    let (world, n) = (3, 1001);
    let codec = Codec::new(GradCompression::Int8, 64).unwrap();
    let full_of = |r: usize| -> Vec<f32> { (0..world * n).map(|i| (((i * 7919 + r * 104_729) % 2001) as f32 - 1000.0) * 1e-3).collect() };
    let results = in_process(world, |comm: Comm| {
        let r = comm.rank();
        let (full, mut mine, mut residual) = (full_of(r), vec![0.0f32; n], vec![0.0f32; (world - 1) * n]);
        comm.reduce_scatter_sum_compressed(&full, &mut mine, &codec, &mut residual, false)?;
        Ok((mine, residual, comm.stats().grad_sent_bytes))
    })
    .unwrap();
    let decoded = |x: &[f32]| round_trip(&codec, x);
    for (r, (mine, _, sent)) in results.iter().enumerate() {
        let mut want = vec![0.0f32; n];
        for s in 0..world {
            let part = full_of(s)[r * n..(r + 1) * n].to_vec();
            let part = if s == r { part } else { decoded(&part) };
            if s == 0 {
                want = part;
            } else {
                want.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            }
        }
        assert!(mine.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rank {r}: not the rank-order sum of the decoded parts");
        assert_eq!(*sent, ((world - 1) * codec.encoded_bytes(n)) as u64, "rank {r}: bytes on the wire");
    }
    // Each rank keeps a residual for the slices it sent (the others', in rank order), none for its own.
    for (s, (_, residual, _)) in results.iter().enumerate() {
        assert_eq!(residual.len(), (world - 1) * n);
        for (slot, r) in (0..world).filter(|&r| r != s).enumerate() {
            let x = &full_of(s)[r * n..(r + 1) * n];
            let left = &residual[slot * n..(slot + 1) * n];
            let d = decoded(x);
            assert!(left.iter().zip(x).zip(&d).all(|((l, x), d)| l.to_bits() == (x - d).to_bits()), "rank {s}: residual of slice {r}");
        }
    }
}

/// Stage 0's compressed all-reduce against the same arithmetic done here, the same bits on every rank;
/// uncompressed, it is the reduce-scatter's sums gathered.
/// - one phase (auto's at 2 ranks): every rank's whole vector decoded from its encoding (this rank's own too) and
///   summed in rank order; the residual left is what the encoding dropped; one encoding sent.
/// - two phases (auto's from 3 ranks): the compressed reduce-scatter's sums (checked above), each encoded
///   again by its owner and decoded by every rank; the residual is the reduce-scatter's, then the
///   owner's slice's; 2 (N-1) slice encodings sent.
#[test]
fn the_compressed_all_reduce_sums_in_rank_order_in_one_or_two_phases() {
    use zerostream::comm::compress::Codec;
    for (world, two_phases) in [(2, false), (3, true), (4, true), (3, false), (2, true)] {
        let n = world * 1001;
        let slice = n / world;
        let codec = Codec::new(GradCompression::OneBit, 64).unwrap();
        let full_of = |r: usize| -> Vec<f32> { (0..n).map(|i| (((i * 7919 + r * 104_729) % 2001) as f32 - 1000.0) * 1e-3).collect() };
        let results = in_process(world, |comm: Comm| {
            let r = comm.rank();
            let (full, mut sum, mut residual) = (full_of(r), vec![0.0f32; n], vec![0.0f32; n]);
            comm.all_reduce_sum_compressed(&full, &mut sum, &codec, &mut residual, two_phases, false)?;
            let sent = comm.stats().grad_sent_bytes;
            let (mut exact, mut mine) = (vec![0.0f32; n], vec![0.0f32; slice]);
            comm.all_reduce_sum(&full, &mut exact, false)?;
            comm.reduce_scatter_sum(&full, &mut mine, false)?;
            Ok((sum, residual, sent, exact, mine))
        })
        .unwrap();
        let decoded = |x: &[f32]| round_trip(&codec, x);
        let add = |a: &mut Vec<f32>, b: &[f32]| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let diff = |x: &[f32], d: &[f32]| x.iter().zip(d).map(|(x, d)| x - d).collect::<Vec<f32>>();
        assert_eq!(zerostream::comm::AllReducePhases::Auto.two_at(world), world > 2, "auto: two phases from 3 ranks");
        // What each rank's residual should hold, and the sum every rank should hold.
        let (want, residuals): (Vec<f32>, Vec<Vec<f32>>) = if !two_phases {
            let mut want = decoded(&full_of(0));
            (1..world).for_each(|s| add(&mut want, &decoded(&full_of(s))));
            (want, (0..world).map(|r| diff(&full_of(r), &decoded(&full_of(r)))).collect())
        } else {
            // Owner s's slice: the others' parts decoded, its own exact, in rank order.
            let sums: Vec<Vec<f32>> = (0..world)
                .map(|s| {
                    let part = |r: usize| {
                        let p = full_of(r)[s * slice..(s + 1) * slice].to_vec();
                        if r == s { p } else { decoded(&p) }
                    };
                    let mut sum = part(0);
                    (1..world).for_each(|r| add(&mut sum, &part(r)));
                    sum
                })
                .collect();
            let want = sums.iter().flat_map(|s| decoded(s)).collect();
            let residuals = (0..world)
                .map(|r| {
                    let x = full_of(r);
                    let mut left: Vec<f32> = (0..world)
                        .filter(|&s| s != r)
                        .flat_map(|s| diff(&x[s * slice..(s + 1) * slice], &decoded(&x[s * slice..(s + 1) * slice])))
                        .collect();
                    left.extend(diff(&sums[r], &decoded(&sums[r])));
                    left
                })
                .collect();
            (want, residuals)
        };
        let encodings_sent = if two_phases { 2 * (world - 1) * codec.encoded_bytes(slice) } else { (world - 1) * codec.encoded_bytes(n) };
        for (r, (sum, residual, sent, exact, mine)) in results.iter().enumerate() {
            assert_eq!(bits(sum), bits(&want), "world {world} two phases {two_phases}, rank {r}: not the rank-order sums decoded");
            assert_eq!(bits(residual), bits(&residuals[r]), "world {world} two phases {two_phases}, rank {r}: residual");
            assert_eq!(*sent, encodings_sent as u64, "world {world} two phases {two_phases}, rank {r}: bytes on the wire");
            assert_eq!(
                bits(exact),
                bits(&results[0].3),
                "world {world} two phases {two_phases}, rank {r}: the exact all-reduce differs between ranks"
            );
            assert_eq!(
                bits(&exact[r * slice..(r + 1) * slice]),
                bits(mine),
                "world {world} two phases {two_phases}, rank {r}: not the reduce-scatter's sums"
            );
        }
    }
}

/// `--param-compression`: the working copy's all-gather sends what its codec promises at every stage,
/// every rank computes with the same decoded copy (ranks agree bit for bit, checked by `run`), losses
/// stay near `none`'s, and a bf16 exchange of a bf16 working copy is `none` exactly.
#[test]
fn param_compression_sends_fewer_bytes_and_keeps_the_ranks_identical() {
    use zerostream::comm::compress::ParamCompression;
    use zerostream::train::Precision;
    let with = |stage, pc, precision| TrainConfig { param_compression: pc, precision, ..config(GradCompression::None, stage) };
    for stage in [ZeroStage::One, ZeroStage::Two, ZeroStage::Three] {
        let none = run(2, with(stage, ParamCompression::None, Precision::Fp32));
        for (pc, most) in [(ParamCompression::Bf16, 0.5), (ParamCompression::Int8, 0.25 + 1.0 / 256.0)] {
            let got = run(2, with(stage, pc, Precision::Fp32));
            // Steps 1 on, where both gather; at stages 1-2 only the compressed run gathers before step
            // 0 too (the exact copy is every rank's already; the decoded one has to be made).
            let ratio = got.param_bytes[1..].iter().sum::<u64>() as f64 / none.param_bytes[1..].iter().sum::<u64>() as f64;
            assert!(got.param_bytes[0] > 0, "stage {} {pc:?}: no gather before the first step", stage.number());
            assert!(ratio <= most * 1.01 + 1e-3 && ratio > 0.0, "stage {} {pc:?}: {ratio:.4} of none's parameter bytes", stage.number());
            assert_eq!(got.grad_bytes, none.grad_bytes, "{pc:?}: the gradients' exchange is unchanged");
            let worst = got.losses.iter().zip(&none.losses).map(|(a, b)| (a - b).abs() / b).fold(0.0, f64::max);
            assert!(worst < 0.01, "stage {} {pc:?}: losses {:?} against none's {:?}", stage.number(), got.losses, none.losses);
            assert_ne!(got.weights, none.weights, "{pc:?}: compression changed nothing");
            println!("stage {} {pc:?}: {ratio:.4} of none's parameter bytes; losses within {worst:.2e}", stage.number());
        }
    }
    // Every stage computes with the decoded copy from the first step on (stages 1-2 had started from
    // the exact one), so with one micro-batch per rank (the same sums) the stages give one run.
    let int8: Vec<_> = [ZeroStage::One, ZeroStage::Two, ZeroStage::Three]
        .into_iter()
        .map(|stage| run(2, with(stage, ParamCompression::Int8, Precision::Fp32)))
        .collect();
    for (stage, got) in [1, 2].into_iter().zip(&int8) {
        assert_eq!((&got.losses, &got.weights), (&int8[2].losses, &int8[2].weights), "int8 stage {stage} against stage 3");
    }
    let bf16 = run(2, with(ZeroStage::Two, ParamCompression::None, Precision::Bf16));
    let same = run(2, with(ZeroStage::Two, ParamCompression::Bf16, Precision::Bf16));
    assert_eq!((&same.weights, &same.losses), (&bf16.weights, &bf16.losses), "bf16 over a bf16 copy is the copy's words");
    assert_eq!(same.codec_seconds, 0.0, "bf16 over a bf16 copy is gathered as it is, without coding");
}

/// `--grad-compression-warmup N`: the first N steps cross uncompressed (as none's, byte for byte and
/// bit for bit), the later ones compressed.
#[test]
fn the_warmup_steps_cross_uncompressed() {
    let none = run(2, config(GradCompression::None, ZeroStage::Two));
    let warm = run(2, TrainConfig { grad_compression_warmup: 3, ..config(GradCompression::OneBit, ZeroStage::Two) });
    assert_eq!(warm.grad_bytes[..3], none.grad_bytes[..3], "the warm-up steps send none's bytes");
    assert_eq!(warm.losses[..4], none.losses[..4], "the warm-up steps compute none's update (step 3's loss is before its exchange)");
    assert!(warm.grad_bytes[3..].iter().zip(&none.grad_bytes[3..]).all(|(w, n)| w * 16 < *n), "compressed after the warm-up");
    let all_warm = run(2, TrainConfig { grad_compression_warmup: 100, ..config(GradCompression::OneBit, ZeroStage::Two) });
    assert_eq!(all_warm.weights, none.weights);
}

/// `bench collectives --grad-compression MODE` times the compressed reduce-scatter with the codec's
/// bytes on the wire and its coding time (it once failed on the residual's length).
#[test]
fn bench_collectives_times_each_compressed_mode() {
    use zerostream::comm::compress::Codec;
    let slice_bytes = 64 << 10;
    for mode in ["bf16", "int8", "onebit", "topk:0.01"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zerostream"))
            .args(["bench", "collectives", "--world-size", "2", "--sizes", "64KiB", "--reps", "1", "--json", "--grad-compression", mode])
            .output()
            .expect("running zerostream");
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        let runs = json["runs"].as_array().expect("runs");
        let row = runs.iter().find(|r| r["op"] == format!("reduce-scatter {mode}")).unwrap_or_else(|| panic!("{mode}: no row in {json}"));
        let codec = Codec::new(mode.parse().unwrap(), zerostream::comm::compress::DEFAULT_CHUNK_ELEMS).unwrap();
        assert_eq!(row["wire_bytes_per_rank"], codec.encoded_bytes(slice_bytes / 4) as u64, "{mode}: {row}");
        assert!(row["seconds"].as_f64().unwrap() > 0.0 && row["codec_seconds"].as_f64().unwrap() > 0.0, "{mode}: {row}");
        // Stage 0's all-reduce of the same gradient: each rank's encoding of the whole (2 slices) to the other.
        let row =
            runs.iter().find(|r| r["op"] == format!("all-reduce {mode} (stage 0)")).unwrap_or_else(|| panic!("{mode}: no row in {json}"));
        assert_eq!(row["wire_bytes_per_rank"], codec.encoded_bytes(2 * slice_bytes / 4) as u64, "{mode}: {row}");
    }
}
