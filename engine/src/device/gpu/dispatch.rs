//! Recording and submitting the gpu device's work: the pending command encoder every op records into
//! (submitted when a result is read back, or after `MAX_PENDING_PASSES` passes), `synchronize` (its
//! waits bounded by `gpu/wait.rs`), the pipeline cache, and the one place a kernel is dispatched (its
//! Params into the uniform arena's slot). A child module of `gpu`, so it reaches the device's fields.

use super::{GpuDevice, MAX_PARAMS_BYTES, MAX_PENDING_PASSES};
use zerostream_shaders as shaders;

impl GpuDevice {
    /// Waits until every recorded pass and queued write has run, and every copy issued on a copy queue;
    /// panics where the device is lost.
    pub fn synchronize(&self) {
        if let Err(e) = self.try_synchronize() {
            panic!("{e:#}");
        }
    }

    /// [`Self::synchronize`], with a lost device or a failed copy queue as an error.
    pub fn try_synchronize(&self) -> anyhow::Result<()> {
        if self.flush().is_none() {
            // Queued writes reach the GPU only with a submission: one of nothing carries them, so
            // raw copies after this (`copy_on_queue`) see them.
            self.queue.submit([]);
        }
        Self::wait_for_submission(&self.device, None).map_err(|e| e.context("waiting for the GPU's work"))?;
        self.wait_for_copy_queues().map_err(|e| e.context("waiting for the GPU's copy queues"))
    }

    /// Hands the recorded passes to the queue without waiting for them (`bench overlap` issues copies
    /// behind them).
    pub fn submit_recorded(&self) {
        self.flush();
    }

    /// Submits the pending encoder (if any); returns its submission.
    pub(super) fn flush(&self) -> Option<wgpu::SubmissionIndex> {
        let mut submission = None;
        let route = self.route();
        // Queued writes the route tracks land with the next submission: make one.
        if route.as_ref().is_some_and(|r| r.has_pending()) && self.encoder.borrow().is_none() {
            *self.encoder.borrow_mut() = Some(self.device.create_command_encoder(&Default::default()));
        }
        if let Some(mut encoder) = self.encoder.borrow_mut().take() {
            let timestamps = self.busy.as_ref().and_then(|b| b.before_submit(&self.device, &mut encoder));
            // Queue writes land before the next submission's commands, after the previous one's.
            let mut bytes = self.uniform_bytes.borrow_mut();
            if !bytes.is_empty() {
                self.queue.write_buffer(&self.uniform_arena, 0, &bytes);
                bytes.clear();
            }
            let compute_value = route.as_ref().map(|r| r.before_submit(&self.queue));
            submission = Some(self.queue.submit([encoder.finish()]));
            if let (Some(route), Some(value)) = (&route, compute_value) {
                route.after_submit(&self.queue, value);
            }
            if let (Some(busy), Some((readback, passes))) = (&self.busy, timestamps) {
                busy.after_submit(readback, passes);
            }
        }
        self.pending_passes.set(0);
        submission
    }

    pub(super) fn pipeline(&self, kernel: shaders::Kernel, entry: &'static str) -> wgpu::ComputePipeline {
        if let Some(p) = self.pipelines.borrow().get(&(kernel.name, entry)) {
            return p.clone();
        }
        let module = self
            .modules
            .borrow_mut()
            .entry(kernel.name)
            .or_insert_with(|| {
                let desc =
                    wgpu::ShaderModuleDescriptor { label: Some(kernel.name), source: wgpu::ShaderSource::Wgsl(kernel.source.into()) };
                // Debug builds keep wgpu's run-time checks (bounds clamping, loop bounding, guarded
                // division), so a kernel that strays is caught by the tests; release builds drop them,
                // except on a software adapter: lavapipe's LLVM takes minutes to compile the unchecked
                // attention kernels (forward 36 s, backward 242 s on 2 cores, against 1-2 s checked),
                // and a software adapter's speed is not what it is for.
                let checked = cfg!(debug_assertions) || self.summary.device_type == wgpu::DeviceType::Cpu;
                if checked {
                    self.device.create_shader_module(desc)
                } else {
                    // SAFETY: every kernel indexes its bindings only inside the windows the dispatch
                    // binds (the tests compare each kernel with its twin at tile edges and under 64 KiB
                    // windows), its loops are bounded by its Params, and it divides only by non-zero
                    // constants or sizes (dispatch skips empty work).
                    unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
                }
            })
            .clone();
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.name),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        self.pipelines.borrow_mut().insert((kernel.name, entry), pipeline.clone());
        pipeline
    }

    /// Records one dispatch: `params` fill the uniform at binding 0, `storage` the numbered bindings.
    pub(super) fn dispatch(
        &self,
        kernel: shaders::Kernel,
        entry: &'static str,
        params: &[u32],
        storage: &[(u32, wgpu::BufferBinding<'_>)],
        workgroups: [u32; 3],
    ) {
        if workgroups.contains(&0) {
            return;
        }
        let pipeline = self.pipeline(kernel, entry);
        // This pass's Params go into its slot of the arena (written at flush, before the submission).
        let params_bytes: &[u8] = bytemuck::cast_slice(params);
        assert!(
            params_bytes.len() <= MAX_PARAMS_BYTES && params_bytes.len().is_multiple_of(16),
            "{}: Params of {} bytes",
            kernel.name,
            params_bytes.len()
        );
        let slot_offset = self.pending_passes.get() * self.uniform_slot_bytes;
        {
            let mut bytes = self.uniform_bytes.borrow_mut();
            bytes.resize(slot_offset, 0);
            bytes.extend_from_slice(params_bytes);
        }
        let uniform = wgpu::BufferBinding {
            buffer: &self.uniform_arena,
            offset: slot_offset as u64,
            size: wgpu::BufferSize::new(params_bytes.len() as u64),
        };
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: wgpu::BindingResource::Buffer(uniform) }];
        entries.extend(
            storage
                .iter()
                .map(|(binding, b)| wgpu::BindGroupEntry { binding: *binding, resource: wgpu::BindingResource::Buffer(b.clone()) }),
        );
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel.name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        {
            let mut slot = self.encoder.borrow_mut();
            let encoder = slot.get_or_insert_with(|| self.device.create_command_encoder(&Default::default()));
            let timestamp_writes = self.busy.as_ref().map(|b| b.next_pass());
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(entry), timestamp_writes });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        }
        // Before the flush below, which must carry them.
        if let Some(route) = self.route() {
            route.track(storage.iter().map(|(_, b)| b.buffer));
        }
        self.pending_passes.set(self.pending_passes.get() + 1);
        if self.pending_passes.get() >= MAX_PENDING_PASSES {
            self.flush();
        }
    }

    /// Records `f` into the pending command encoder: after every pass recorded so far, before any recorded
    /// later. For commands that share the kernels' stream: copies (uploads, read-backs) and, for
    /// `device::timing` (`zerostream bench kernels`), timestamps that land exactly between two ops.
    pub(in crate::device) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut slot = self.encoder.borrow_mut();
        f(slot.get_or_insert_with(|| self.device.create_command_encoder(&Default::default())));
    }
}
