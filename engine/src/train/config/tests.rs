use super::*;

#[test]
fn flags_round_trip() {
    let mut tc = TrainConfig {
        precision: Precision::Bf16,
        gpu_mem_budget: Some(1 << 30),
        nvme_dirs: vec!["/x".into(), "/y".into()],
        dropout: Some(0.1),
        seed: 7,
        matmul_inputs: MatmulInputs::F16,
        adam_state: AdamState::Bf16,
        params_ram_cache_bytes: 3 << 30,
        grad_compression: GradCompression::TopK(0.25),
        grad_compression_chunk: 64,
        grad_compression_warmup: 30,
        freeze_variance: true,
        all_reduce_phases: crate::comm::AllReducePhases::Two,
        param_compression: ParamCompression::Int8,
        optimizer: Optimizer::Lars,
        momentum: 0.8,
        trust_coefficient: 0.02,
        pin_memory: false,
        copy_queue: true,
        ..TrainConfig::default()
    };
    tc.lr.schedule = LrSchedule::Cosine;
    tc.offload_optimizer = Tier::Nvme;
    tc.offload_gradients = Some(Tier::Ram);
    let flags = tc.to_flags();
    assert_eq!(flags["precision"], "bf16");
    assert_eq!(flags["lr-schedule"], "cosine");
    assert_eq!(flags["matmul-inputs"], "f16");
    assert_eq!(flags["adam-state"], "bf16");
    assert_eq!(flags["grad-compression"], "topk:0.25");
    assert_eq!(flags["optimizer"], "lars");
    let back = TrainConfig::from_flags(&flags).unwrap();
    assert_eq!(format!("{back:?}"), format!("{tc:?}"));
    for k in MEANING_FLAGS {
        assert!(flags.contains_key(*k), "{k}");
    }
}
