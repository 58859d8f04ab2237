//! The planner never accepts a device budget it cannot keep (issue #13): budgets are walked from one
//! byte under the reported minimum up past the size of the whole model, on the cpu device (which
//! charges its budget as the gpu device does), and every accepted budget must train steps with a peak
//! of device bytes within it, every refused one must be refused naming the minimum.
//!
//! The model is a GPT-2 shape with few layers and a vocabulary large beside its width, so the head group
//! (embeddings, logits) is most of the device bytes, as in GPT-2 XL's failure at 2 and 3 GiB.

mod common;

use common::gpu_or_skip;
use zerostream::device::{Backend, CpuDevice, GpuDevice};
use zerostream::model::Model;
use zerostream::train::{ModelSource, Precision, TrainConfig, Trainer, minimum_device_bytes_on, plan_on};
use zerostream_checkpoints::TokenFile;
use zerostream_checkpoints::config::Gpt2Config;
use zerostream_offload::Tier;

fn small_gpt2() -> Model {
    let mut c = Gpt2Config::preset("gpt2").unwrap();
    (c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head) = (3001, 32, 32, 5, 4);
    Model::Gpt2(c)
}

/// Trains two steps on `dev` and returns its peak device bytes, or the error the trainer gave.
fn peak_of_two_steps<D: Backend>(dev: &D, model: &Model, tc: &TrainConfig, tokens: &TokenFile) -> anyhow::Result<u64> {
    let mut trainer = Trainer::new(dev, &ModelSource::Random { model: model.clone(), seed: 7 }, tc.clone())?;
    for _ in 0..2 {
        let r = trainer.train_step(tokens)?;
        assert!(r.loss.is_finite(), "loss {}", r.loss);
    }
    trainer.finish()?;
    Ok(dev.alloc_stats().peak_bytes)
}

#[test]
fn every_accepted_budget_is_kept_and_every_refused_one_names_the_minimum() {
    // The cpu device allocates exactly what the plan counts: the peak equals the plan.
    walk_budgets(CpuDevice::new, true);
}

#[test]
fn every_accepted_budget_is_kept_on_the_gpu() {
    // The gpu device's token buffers depend on how many distinct tokens a micro-batch has, which the
    // plan bounds from above: the peak is at most the plan.
    if gpu_or_skip("every_accepted_budget_is_kept_on_the_gpu").is_some() {
        walk_budgets(|budget| GpuDevice::open(None, budget).unwrap(), false);
    }
}

/// Walks each configuration's budgets on devices from `open(budget)`; `exact`: the peak must equal the
/// plan's device bytes, not only stay within the budget.
fn walk_budgets<D: Backend>(open: impl Fn(Option<u64>) -> D, exact: bool) {
    let model = small_gpt2();
    let tokens: Vec<u16> = (0..4096u32).map(|i| ((i.wrapping_mul(2654435761) >> 7) % 3001) as u16).collect();
    let tokens = TokenFile::from_tokens("walk", &tokens);
    let nvme = tempfile::tempdir().unwrap();
    let base = TrainConfig { batch: 2, seq_len: 16, steps: 2, ..TrainConfig::default() };
    let variants = [
        ("fp32", base.clone()),
        ("fp32 --recompute --grad-accum 2", TrainConfig { recompute: true, grad_accum: 2, ..base.clone() }),
        ("bf16", TrainConfig { precision: Precision::Bf16, ..base.clone() }),
        (
            "bf16 --recompute, optimizer and params on nvme",
            TrainConfig {
                precision: Precision::Bf16,
                recompute: true,
                offload_optimizer: Tier::Nvme,
                offload_params: Tier::Nvme,
                nvme_dirs: vec![nvme.path().into()],
                ..base.clone()
            },
        ),
    ];
    let costs = open(None).alloc_costs();
    for (what, tc) in variants {
        let minimum = minimum_device_bytes_on(&model, &tc, costs);
        let everything = plan_on(&model, &tc, 1, costs).unwrap();
        assert_eq!(everything.block_slots, model.n_layer(), "{what}: no budget, every block gets a slot");
        let slot_bytes = everything.device_block_slot_bytes;
        // One byte under the minimum, the minimum, then half a slot at a time past every slot.
        let mut budgets = vec![minimum - 1];
        budgets.extend((0..=2 * model.n_layer() as u64).map(|k| minimum + k * slot_bytes / 2));
        let mut slots_seen = Vec::new();
        for budget in budgets {
            let tc = TrainConfig { gpu_mem_budget: Some(budget), ..tc.clone() };
            match plan_on(&model, &tc, 1, costs) {
                Err(e) => {
                    assert!(budget < minimum, "{what}: budget {budget} refused though the minimum is {minimum}: {e:#}");
                    assert!(format!("{e:#}").contains(&format!("minimum of {minimum} bytes")), "{what}: {e:#}");
                    // The trainer refuses it too, before any work.
                    let err = peak_of_two_steps(&open(Some(budget)), &model, &tc, &tokens).unwrap_err();
                    assert!(format!("{err:#}").contains(&format!("minimum of {minimum} bytes")), "{what}: {err:#}");
                }
                Ok(p) => {
                    assert!(budget >= minimum, "{what}: budget {budget} under the minimum {minimum} accepted");
                    assert!(p.device_bytes() <= budget, "{what}: plan of {} bytes accepted under {budget}", p.device_bytes());
                    let peak = peak_of_two_steps(&open(Some(budget)), &model, &tc, &tokens)
                        .unwrap_or_else(|e| panic!("{what}: budget {budget} accepted ({} slots) but the run failed: {e:#}", p.block_slots));
                    assert!(peak <= budget, "{what}: peak {peak} bytes above the accepted budget {budget}");
                    if exact {
                        assert_eq!(peak, p.device_bytes(), "{what}: the plan's {} bytes are not the peak", p.device_bytes());
                    }
                    slots_seen.push(p.block_slots);
                }
            }
        }
        // The walk went from two slots to all of them.
        assert_eq!(slots_seen.first(), Some(&2), "{what}: {slots_seen:?}");
        assert_eq!(slots_seen.last(), Some(&model.n_layer()), "{what}: {slots_seen:?}");
    }
}
