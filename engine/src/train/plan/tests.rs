//! Tests of `plan`.

use super::*;
use crate::device::MatmulInputs;
use crate::train::config::Precision;

/// With the optimizer state and the parameters on NVMe, the RAM the plan counts is what is paged in
/// at once: the sweep's three largest groups (master, m, v, gradient: 16 B/param), the device
/// thread's gradients and working copies — not the 18 B/param that live on NVMe.
#[test]
fn state_on_nvme_counts_only_the_groups_paged_in() {
    let model = Model::preset("gpt2-xl").unwrap();
    let tc =
        TrainConfig { offload_optimizer: Tier::Nvme, offload_params: Tier::Nvme, precision: Precision::Bf16, ..TrainConfig::default() };
    let p = plan(&model, &tc, 1).unwrap();
    let (ram, nvme) = p.host_bytes_per_rank();
    let groups = group_layouts(&model);
    let mut lens: Vec<u64> = groups.iter().map(|g| g.len as u64).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let padded = |n: u64| n.div_ceil(64) * 64;
    let (head, block) = (padded(lens[0]), padded(lens[1]));
    // The sweep's three groups of state and gradients, the device thread's gradient and the one
    // written behind, and bf16 working copies: the sweep's, the device thread's, the fresh ones
    // kept for the forward and the one read ahead.
    let working_copies = 3 + crate::train::worker::FRESH_COPIES_AHEAD as u64;
    assert_eq!(ram, 16 * (head + 2 * block) + 2 * 4 * head + working_copies * 2 * head);
    let sequential = plan(&model, &TrainConfig { sequential: true, ..tc.clone() }, 1).unwrap();
    let background = (working_copies - 2) * 2 * head + 4 * head;
    assert_eq!(ram - sequential.host_bytes_per_rank().0, background, "no fresh copies, reads ahead or writes behind in sequence");
    assert_eq!(nvme, p.host_optimizer_bytes + p.host_grad_bytes + p.host_working_bytes);
    assert_eq!(p.host_grad_bytes, 4 * groups.iter().map(|g| padded(g.len as u64)).sum::<u64>());
    // All in RAM: nothing is paged, and the whole state counts.
    let in_ram = plan(&model, &TrainConfig { precision: Precision::Bf16, ..TrainConfig::default() }, 1).unwrap();
    assert_eq!(in_ram.host_paged_in_bytes, 0);
    assert_eq!(in_ram.host_bytes_per_rank(), (nvme, 0));
}

/// `--matmul-inputs f16` on the gpu device plans its f16 operand scratch; the cpu device has none.
#[test]
fn f16_inputs_plan_the_gpu_operand_scratch() {
    let model = Model::preset("gpt2").unwrap();
    let f32_inputs = TrainConfig::default();
    let f16_inputs = TrainConfig { matmul_inputs: MatmulInputs::F16, ..f32_inputs.clone() };
    let extra = |costs| minimum_device_bytes_on(&model, &f16_inputs, costs) - minimum_device_bytes_on(&model, &f32_inputs, costs);
    assert_eq!(extra(AllocCosts::GPU), crate::device::alloc::GPU_COOP_SCRATCH_BYTES);
    assert_eq!(extra(AllocCosts::CPU), 0);
}

/// The RAM a run needs counts the device's share of it: the cpu device's whole memory (at every
/// budget), or the gpu device's host staging and two blocks' gradient read-backs.
#[test]
fn host_ram_counts_what_the_device_takes_of_it() {
    let model = Model::preset("gpt2").unwrap();
    for tc in [
        TrainConfig::default(),
        TrainConfig { gpu_mem_budget: Some(minimum_device_bytes(&model, &TrainConfig::default())), ..TrainConfig::default() },
    ] {
        let cpu = plan_on(&model, &tc, 1, AllocCosts::CPU).unwrap();
        assert!(cpu.device_bytes() > 0);
        assert_eq!(cpu.ram_bytes_per_rank(), cpu.host_bytes_per_rank().0 + cpu.device_bytes());
    }
    let gpu = plan_on(&model, &TrainConfig::default(), 1, AllocCosts::GPU).unwrap();
    let block = group_layouts(&model)[1].len as u64;
    let chunk = model.vocab_chunks(TrainConfig::default().vocab_chunk_rows).rows_per_chunk * model.width();
    assert_eq!(gpu.host_device_bytes(), (512 << 20) + (256 << 20) + (2 * 4 * block).max(4 * chunk as u64));
    assert_eq!(gpu.ram_bytes_per_rank(), gpu.host_bytes_per_rank().0 + gpu.host_device_bytes());
    assert!(gpu.host_summary().contains("the device's 0.80 GiB included"), "{}", gpu.host_summary());
    // Llama-3.2-1B's 232 MiB blocks: two spare read-backs of a block's size, beyond the 256 MiB.
    let llama = Model::preset("llama-3.2-1b").unwrap();
    let gpu = plan_on(&llama, &TrainConfig::default(), 1, AllocCosts::GPU).unwrap();
    let block = 4 * group_layouts(&llama)[1].len as u64;
    let chunk = 4 * (llama.vocab_chunks(TrainConfig::default().vocab_chunk_rows).rows_per_chunk * llama.width()) as u64;
    assert!(block > 128 << 20 && block > chunk, "{block} {chunk}");
    assert_eq!(gpu.host_device_bytes(), (512 << 20) + 2 * block + 2 * block);
}

/// The advice beside a plan too big for the RAM names what applies: the flags that would move what is
/// still in RAM, or, all of it on NVMe already, what the RAM then holds.
#[test]
fn the_ram_advice_names_what_would_help() {
    let model = Model::preset("gpt2").unwrap();
    let in_ram = plan_on(&model, &TrainConfig::default(), 1, AllocCosts::GPU).unwrap();
    let advice = in_ram.ram_advice();
    assert!(advice.contains("--offload-optimizer nvme, --offload-gradients nvme, --offload-params nvme"), "{advice}");
    let nvme = TrainConfig {
        offload_optimizer: Tier::Nvme,
        offload_gradients: Some(Tier::Nvme),
        offload_params: Tier::Nvme,
        nvme_dirs: vec!["/tmp/zs".into()],
        ..TrainConfig::default()
    };
    let advice = plan_on(&model, &nvme, 1, AllocCosts::GPU).unwrap().ram_advice();
    assert!(advice.starts_with("all state is on NVMe already") && !advice.contains("--offload"), "{advice}");
}

/// At --zero-stage 0 every rank plans the whole model's state, as one rank does (master, moments,
/// gradients and working copy), and error-feedback residuals over whole groups; the sharded stages
/// plan slices, and residuals over the other ranks' slices only.
#[test]
fn stage_zero_plans_the_whole_state_on_every_rank() {
    use crate::comm::compress::GradCompression;
    use crate::train::ZeroStage;
    let model = Model::preset("gpt2").unwrap();
    let at = |stage, world| {
        let tc = TrainConfig { zero_stage: stage, grad_compression: GradCompression::OneBit, ..TrainConfig::default() };
        plan(&model, &tc, world).unwrap()
    };
    let (one, zero, two, three) = (at(ZeroStage::Two, 1), at(ZeroStage::Zero, 2), at(ZeroStage::Two, 2), at(ZeroStage::Three, 2));
    let whole = |p: &Placement| (p.host_optimizer_bytes, p.host_grad_bytes, p.host_working_bytes);
    assert_eq!(whole(&zero), whole(&one), "stage 0 holds the whole, as one rank does");
    assert_eq!(one.host_residual_bytes, 0, "one rank compresses nothing");
    assert_eq!(zero.host_residual_bytes, one.host_grad_bytes, "stage 0's residuals: whole groups in f32");
    assert_eq!(2 * two.host_optimizer_bytes, one.host_optimizer_bytes, "stage 2 holds half the state");
    assert_eq!(two.host_residual_bytes, two.host_grad_bytes, "stage 2's residuals: the other rank's slices");
    assert_eq!(2 * three.host_working_bytes, one.host_working_bytes, "stage 3 holds half the working copy");
}

/// Two stripes in one file system share its free space: state that fits half of it in each stripe but
/// not the whole is refused, naming both directories; on file systems of their own it would not be.
#[test]
fn nvme_stripes_on_one_file_system_are_checked_together() {
    let dir = tempfile::tempdir().unwrap();
    let stripes: Vec<std::path::PathBuf> = ["a", "b"].iter().map(|s| dir.path().join(s)).collect();
    let model = Model::preset("gpt2").unwrap();
    let tc = TrainConfig { offload_optimizer: Tier::Nvme, nvme_dirs: stripes.clone(), ..TrainConfig::default() };
    let p = plan(&model, &tc, 1).unwrap();
    let per_rank = p.host_bytes_per_rank().1 + p.host_nvme_spare_bytes;
    let free = zerostream_offload::free_bytes(dir.path()).unwrap();
    // The ranks whose state is about 1.5x the free space: each stripe's half is about 0.75x of it.
    let ranks_here = (free + free / 2).div_ceil(per_rank) as usize;
    let err = p.check_nvme_room(&stripes, ranks_here).unwrap_err().to_string();
    assert!(err.contains("in these 2 directories, which share a file system, 2/2 of the striped state"), "{err}");
    assert!(err.contains(&format!("{}, {}", stripes[0].display(), stripes[1].display())), "{err}");
    p.check_nvme_room(&stripes[..1], ranks_here / 2).unwrap();
}
