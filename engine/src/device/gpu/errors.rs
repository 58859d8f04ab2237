//! wgpu's errors caught instead of fatal, for `zerostream selftest`: a kernel that does not compile on an
//! adapter, or an op that wgpu refuses, becomes an error in words for that check while the rest run.
//!
//! Without an error scope wgpu hands every error to the device's uncaptured-error handler, which panics
//! (that stays so for training: an invalid dispatch there is a bug). A child module of `gpu`, so it uses
//! the device's pipeline cache.

use super::GpuDevice;
use zerostream_shaders as shaders;

impl GpuDevice {
    /// Runs `f` (and waits for the work it recorded) with wgpu's validation, out-of-memory and internal
    /// errors captured instead of reaching the uncaptured-error handler; returns the first, in words.
    pub fn catch_errors(&self, f: &mut dyn FnMut()) -> Option<String> {
        let scopes = [wgpu::ErrorFilter::Validation, wgpu::ErrorFilter::OutOfMemory, wgpu::ErrorFilter::Internal]
            .map(|filter| self.device.push_error_scope(filter));
        f();
        // A lost device is this check's error too, not a panic that ends the whole selftest.
        let lost = self.try_synchronize().err().map(|e| one_line(&format!("{e:#}")));
        // Scopes pop in the reverse order of their pushing.
        let errors: Vec<String> =
            scopes.into_iter().rev().filter_map(|scope| pollster::block_on(scope.pop())).map(|e| one_line(&e.to_string())).collect();
        errors.into_iter().next().or(lost)
    }

    /// Creates the pipeline of every entry point of `kernel` (kept in the device's cache for later
    /// dispatches) and returns how many, or the adapter's refusal in words.
    pub fn compile(&self, kernel: shaders::Kernel) -> Result<usize, String> {
        let entries = kernel.entry_points();
        match self.catch_errors(&mut || entries.iter().for_each(|&entry| drop(self.pipeline(kernel, entry)))) {
            None => Ok(entries.len()),
            Some(error) => {
                // Forget the invalid module and pipelines: a later dispatch reports the error again
                // (to its own scope) rather than running a stale handle.
                self.modules.borrow_mut().remove(kernel.name);
                self.pipelines.borrow_mut().retain(|(name, _), _| *name != kernel.name);
                Err(error)
            }
        }
    }
}

/// wgpu's multi-line error text ("Validation Error\n\nCaused by:\n  ...") as one line, without the
/// source excerpt a shader error draws under it.
fn one_line(text: &str) -> String {
    let drawn = |l: &str| l.starts_with('┌') || l.contains('│');
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !drawn(l)).collect::<Vec<_>>().join(" ")
}
