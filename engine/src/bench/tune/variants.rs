//! How `zerostream tune` times one shape class's variants: each made the device's choice in turn, its
//! output's bits checked against the reference variant's, the hopeless ones timed once and, after a
//! tune's first classes, not on later classes like them ([`Hopeless`]); and where the class's time
//! went ([`Spent`]).

use std::time::Instant;

use anyhow::Result;
use rayon::prelude::*;

use crate::device::gpu::GpuTensor;
use crate::device::matmul_tuning::MatmulClass;
use crate::device::timing::Timer;
use crate::device::{Backend, GpuDevice};

/// The variants of one shape class as timed (matmul tiles or attention tiles).
#[derive(Clone, Debug)]
pub struct VariantTimes<V> {
    /// (variant, seconds) of every variant timed, the baseline (the vendor's default) first: the median
    /// of several runs, or of one for a variant far slower than the best before it.
    pub times: Vec<(V, f64)>,
    /// Variants left out because their result differed from the reference's (a bug: reported loudly).
    pub mismatched: Vec<V>,
    /// Where the class's wall-clock time went.
    pub spent: Spent,
}

/// Where a class's tuning time went, wall clock, in seconds: what the next lent GPU's run reads to see
/// whether a tune is bound by its set-up, its checks or its timings.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// Making and filling the class's operands (for every attention class, forward ones too, also the
    /// default forward that makes the backward's inputs: its output and log-sum-exp).
    pub setup_s: f64,
    /// Each variant's first run (pipeline creation on first use, warm-up) and the comparison of its
    /// output with the reference's bits (a read-back), the reference's own run included.
    pub check_s: f64,
    /// The timed runs.
    pub timing_s: f64,
}

impl Spent {
    pub fn total_s(&self) -> f64 {
        self.setup_s + self.check_s + self.timing_s
    }

    /// `self` and `other` added field by field.
    pub fn plus(self, other: Spent) -> Spent {
        Spent { setup_s: self.setup_s + other.setup_s, check_s: self.check_s + other.check_s, timing_s: self.timing_s + other.timing_s }
    }
}

impl<V: Copy> VariantTimes<V> {
    pub fn best(&self) -> (V, f64) {
        *self.times.iter().min_by(|a, b| a.1.total_cmp(&b.1)).expect("the default is always timed")
    }
    pub fn default_seconds(&self) -> f64 {
        self.times[0].1
    }
}

/// How many times the best median so far one run of a variant may take and still be timed in full.
const SLOWER_THAN_BEST: f64 = 2.0;

/// The variants a class is timed with: `list`, its first the baseline (timed first, its time the one a
/// speed-up is over), and `reference`, whose output bits every variant must give: the plainest kernel
/// (the template's own default), so a bug in a faster baseline shows as the baseline's mismatch, not
/// as every other variant's.
pub(crate) struct Candidates<'a, V> {
    pub(crate) reference: V,
    pub(crate) list: &'a [V],
    /// Whether [`tune_classes`] may stop timing variants hopeless on the first classes ([`Hopeless`]):
    /// not where the user named the variants.
    pub(crate) prune: bool,
}

/// Variants that cannot win, found on a tune's first classes and left out of later classes like them:
/// on an H200, 11 of the 23 cooperative-matrix variants were 3.6-59x slower than their class's best on
/// every one of 42 classes, yet each cost a warm-up, a read-back and a timed run per class. Leaving a
/// variant out changes no result (every variant gives the same bits), only which variant a later class
/// may choose. A verdict drawn on the first classes (a model's first layer: K of 768-4096) says nothing
/// about unlike shapes (the vocabulary chunk's K of 8192, where a 64x64 tile won on the H200), so on a
/// class outside them every variant is timed again; that class then joins the evidence, and a dropped
/// variant that comes within [`Self::RATIO`] of its best there is timed everywhere again.
pub(super) struct Hopeless<V> {
    /// Per variant of the list: slower than [`Self::RATIO`] x the best on every class counted.
    so_far: Vec<(V, bool)>,
    /// The classes timed with every variant: the first [`Self::CLASSES`], then each one unlike them.
    counted: Vec<MatmulClass>,
    /// Never dropped: the baseline and the reference bits' variant.
    keep: Vec<V>,
}

impl<V: Copy + PartialEq> Hopeless<V> {
    /// How many times its class's best a variant's time must be to count as hopeless there.
    pub(super) const RATIO: f64 = 3.0;
    /// On how many classes before a verdict.
    pub(super) const CLASSES: usize = 6;

    pub(super) fn new(list: &[V], keep: &[V]) -> Self {
        Hopeless { so_far: list.iter().map(|&v| (v, true)).collect(), counted: Vec::new(), keep: keep.to_vec() }
    }

    /// The variants dropped so far: hopeless on each counted class, once there are enough of them.
    /// A mismatched variant is not hopeless: it stays, to be named again as a bug.
    pub(super) fn dropped(&self) -> Vec<V> {
        if self.counted.len() < Self::CLASSES {
            return Vec::new();
        }
        self.so_far.iter().filter(|(v, hopeless)| *hopeless && !self.keep.contains(v)).map(|(v, _)| *v).collect()
    }

    /// Whether `class` lies within the counted classes: one of their operand layouts and B storages,
    /// and each of its M, N and K buckets within the range all of them span (one range per dimension,
    /// shared by the layouts). Only there are dropped variants left out.
    pub(super) fn covers(&self, class: &MatmulClass) -> bool {
        let within = |bucket: fn(&MatmulClass) -> u8| {
            let (lo, hi) = self.counted.iter().map(bucket).fold((u8::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            (lo..=hi).contains(&bucket(class))
        };
        let layout = |c: &MatmulClass| (c.a_transposed, c.b_transposed, c.b_16bit);
        self.counted.len() >= Self::CLASSES
            && self.counted.iter().any(|c| layout(c) == layout(class))
            && within(|c| c.m_bucket)
            && within(|c| c.n_bucket)
            && within(|c| c.k_bucket)
    }

    /// The variants to time on `class`: `list` less the dropped ones where the class is covered.
    pub(super) fn list_for(&self, class: &MatmulClass, list: &[V]) -> Vec<V> {
        let dropped = if self.covers(class) { self.dropped() } else { Vec::new() };
        list.iter().copied().filter(|v| !dropped.contains(v)).collect()
    }

    /// Counts a class timed with every variant (one not [`Self::covers`]ed); a covered class, timed
    /// without the dropped variants, says nothing about them and is not counted.
    pub(super) fn count(&mut self, class: &MatmulClass, timed: &VariantTimes<V>) {
        if self.covers(class) {
            return;
        }
        let (_, best) = timed.best();
        for (v, hopeless) in &mut self.so_far {
            let time = timed.times.iter().find(|t| t.0 == *v).map(|t| t.1);
            *hopeless &= time.is_some_and(|t| t > Self::RATIO * best);
        }
        self.counted.push(*class);
    }
}

/// How a tune times: with which timer, until when.
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    pub(crate) timer: Timer,
    /// A class not finished by then is not recorded.
    pub(crate) deadline: Instant,
}

/// Times each of the candidates' variants, made the device's choice by `force`: `run` makes one call,
/// writing `outputs`. A variant whose bits differ from the reference's is left out and named.
/// `setup_s` (making the class's operands) is carried into the class's [`Spent`].
/// `None` when the clock's deadline passes before the last variant: a class timed in part is not recorded, since
/// its winner would replace a whole tune's in the saved table.
pub(crate) fn time_variants<V: Copy + PartialEq>(
    dev: &GpuDevice,
    candidates: &Candidates<V>,
    clock: Clock,
    setup_s: f64,
    force: impl Fn(Option<V>) -> Result<()>,
    run: impl Fn(),
    outputs: &[&GpuTensor],
) -> Result<Option<VariantTimes<V>>> {
    let Clock { timer, deadline } = clock;
    let mut spent = Spent { setup_s, ..Spent::default() };
    let check_start = Instant::now();
    let mut reference: Option<Vec<u32>> = None;
    if candidates.list.first() != Some(&candidates.reference) {
        force(Some(candidates.reference))?;
        run();
        reference = Some(output_bits(dev, outputs));
    }
    spent.check_s += check_start.elapsed().as_secs_f64();
    let mut timed = VariantTimes { times: Vec::new(), mismatched: Vec::new(), spent };
    for &variant in candidates.list {
        // Compiling one variant can take minutes on a CPU driver, so the clock is read before each.
        if Instant::now() > deadline {
            force(None)?;
            return Ok(None);
        }
        let check_start = Instant::now();
        force(Some(variant))?;
        run(); // pipeline creation and warm-up, and the bits to compare
        let holds = match &reference {
            None => {
                reference = Some(output_bits(dev, outputs));
                true
            }
            Some(r) => outputs_hold(dev, outputs, r),
        };
        timed.spent.check_s += check_start.elapsed().as_secs_f64();
        if !holds {
            timed.mismatched.push(variant);
            continue;
        }
        let timing_start = Instant::now();
        // About 50 ms of repetitions, at least 3 and at most 20, from one more timed run; a variant whose
        // one run takes over twice the best median so far cannot win and keeps that run's time (on an
        // H200 most staged cooperative-matrix variants are 5-15x slower than the best).
        let once = dev.time_reps(1, timer, &run)?.median_s();
        let best = timed.times.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
        if once > SLOWER_THAN_BEST * best {
            timed.times.push((variant, once));
        } else {
            let reps = ((0.05 / once.max(1e-6)) as usize).clamp(3, 20);
            timed.times.push((variant, dev.time_reps(reps, timer, &run)?.median_s()));
        }
        timed.spent.timing_s += timing_start.elapsed().as_secs_f64();
    }
    force(None)?;
    Ok(Some(timed))
}

/// The bits of `outputs`, one after another: the reference every variant of a class must give.
fn output_bits(dev: &GpuDevice, outputs: &[&GpuTensor]) -> Vec<u32> {
    let pending = dev.begin_read(outputs);
    dev.finish_read_with(pending, |lent| lent.iter().flat_map(|v| v.iter().map(|x| x.to_bits())).collect())
}

/// Whether `outputs` hold `reference`'s bits, compared where they are read back (lent, on rayon's
/// threads): no fresh host vector per variant, which for the largest classes' outputs was 128 MiB to
/// allocate, fault in and fill before comparing (how much of a tune that took is not yet measured).
fn outputs_hold(dev: &GpuDevice, outputs: &[&GpuTensor], reference: &[u32]) -> bool {
    const PIECE: usize = 1 << 16;
    let pending = dev.begin_read(outputs);
    dev.finish_read_with(pending, |lent| {
        let total: usize = lent.iter().map(|v| v.len()).sum();
        let mut at = 0;
        total == reference.len()
            && lent.iter().all(|v| {
                let want = &reference[at..at + v.len()];
                at += v.len();
                v.par_chunks(PIECE).zip(want.par_chunks(PIECE)).all(|(got, want)| got.iter().zip(want).all(|(g, w)| g.to_bits() == *w))
            })
    })
}

/// Deterministic values in [-1, 1) (xorshift, seeded per piece of 64 Ki values so rayon's threads fill
/// the pieces at once: a Llama class's operands are 50M values), enough for timing and for comparing
/// variants' bits. The same values whatever the thread count.
pub(crate) fn values(len: usize, seed: u64) -> Vec<f32> {
    const PIECE: usize = 1 << 16;
    let mut out = vec![0.0f32; len];
    out.par_chunks_mut(PIECE).enumerate().for_each(|(i, piece)| {
        let mut x = (seed ^ (i as u64).wrapping_mul(0xd1b5_4a32_d192_ed03)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for v in piece {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A variant whose outputs differ from the reference's in any output, anywhere (here: the second
    /// output only, past the first comparison piece) is left out as mismatched; the others are timed.
    /// On the adapter `--device gpu` opens by default (skipped without one, failed under
    /// ZEROSTREAM_REQUIRE_GPU=1).
    #[test]
    fn variants_with_other_bits_are_left_out() {
        let Some(dev) = crate::device::gpu::gpu_or_skip("variants_with_other_bits_are_left_out") else { return };
        let (a, b) = (dev.alloc(1000, "a").unwrap(), dev.alloc(100_003, "b").unwrap());
        let chosen = std::cell::Cell::new(None::<u32>);
        let force = |v: Option<u32>| {
            chosen.set(v);
            Ok(())
        };
        let run = || {
            dev.fill(&a, 1.5);
            dev.fill(&b, if chosen.get() == Some(2) { 2.5 } else { 1.5 });
        };
        let candidates = Candidates { reference: 0, list: &[1, 2, 0, 3], prune: false };
        let far = Instant::now() + Duration::from_secs(600);
        let timed = time_variants(&dev, &candidates, Clock { timer: dev.best_timer(), deadline: far }, 0.0, force, run, &[&a, &b])
            .unwrap()
            .unwrap();
        assert_eq!(timed.mismatched, vec![2]);
        assert_eq!(timed.times.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 0, 3]);
        assert_eq!(chosen.get(), None, "the device's own choice is restored");
    }

    /// Only a variant over 3x the best on every one of the first classes is dropped, after the last of
    /// them: not the kept ones (the baseline), not one that came close once, not a mismatched one; and
    /// only on classes like those: on an unlike one every variant is timed again, and one that comes
    /// close there is back for good.
    #[test]
    fn hopeless_variants_are_dropped_on_classes_like_those_they_lost() {
        let times = |t: &[(u32, f64)]| VariantTimes { times: t.to_vec(), mismatched: vec![4], spent: Spent::default() };
        let class = |m, k| MatmulClass { a_transposed: false, b_transposed: true, b_16bit: false, m_bucket: m, n_bucket: 19, k_bucket: k };
        let all = [0, 1, 2, 3, 4, 5];
        let mut hopeless = Hopeless::new(&all, &[0]);
        for i in 0..Hopeless::<u32>::CLASSES {
            assert_eq!(hopeless.dropped(), Vec::<u32>::new(), "before class {i}");
            let first = class(19 + (i % 2) as u8, 19 + (i % 3) as u8 * 2);
            assert_eq!(hopeless.list_for(&first, &all), all, "class {i}: every variant timed");
            let close_once = if i == 2 { 2.9 } else { 10.0 };
            hopeless.count(&first, &times(&[(0, 5.0), (1, 1.0), (2, 3.5), (3, close_once), (5, 4.0)]));
        }
        assert_eq!(hopeless.dropped(), vec![2, 5]);
        let like = class(20, 21);
        assert_eq!(hopeless.list_for(&like, &all), vec![0, 1, 3, 4], "within the first classes' buckets");
        hopeless.count(&like, &times(&[(0, 1.0), (1, 2.0)]));
        assert_eq!(hopeless.dropped(), vec![2, 5], "a covered class is not counted");
        for unlike in [class(20, 26), class(18, 21), MatmulClass { b_16bit: true, ..like }] {
            assert_eq!(hopeless.list_for(&unlike, &all), all, "{} is outside the first classes", unlike.key());
        }
        hopeless.count(&class(20, 26), &times(&[(0, 5.0), (1, 1.0), (2, 3.5), (3, 9.0), (5, 2.0)]));
        assert_eq!(hopeless.dropped(), vec![2], "5 came close on the long-K class");
        assert_eq!(hopeless.list_for(&class(19, 25), &all), vec![0, 1, 3, 4, 5], "the long-K class joined the evidence");
    }

    #[test]
    fn tuner_values_are_the_same_on_any_thread_count() {
        let many = values(300_001, 9);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| values(300_001, 9));
        assert_eq!(many.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), one.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(many.iter().all(|v| (-1.0..1.0).contains(v)) && many[..1 << 16] != many[1 << 16..2 << 16], "pieces differ");
        assert_ne!(values(1000, 1), values(1000, 2));
    }
}
