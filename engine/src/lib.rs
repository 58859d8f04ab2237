//! zerostream's engine: the devices and their kernels, the models, the streaming trainer, evaluation,
//! generation and the benches — everything the `zerostream` binary does, as a library.
//!
//! One dependency line is enough: `zerostream = { path = "engine" }` (the formats and host-memory tiers
//! come along as [`checkpoints`] and [`offload`]), and `use zerostream::prelude::*;` brings in what a
//! training program needs: open a device ([`device::open`]), describe the run ([`TrainConfig`],
//! [`RunOptions`]) and run it ([`run_on`]), or drive the [`Trainer`] a step at a time. The command line's
//! parsing stays in the binary (`src/main.rs`, `src/cli/`); `examples/03_train_library.rs` trains a model
//! in about forty lines.
//!
//! Cargo features: `progress` (the training loop's progress bar, indicatif) and `plot` (SVG curves,
//! plotters) are on by default; `default-features = false` leaves both out. `mpi` adds multi-process
//! ranks.
//!
//! What a program embedding the library shares with it: a GPU wait past
//! `ZEROSTREAM_GPU_WAIT_LIMIT_S` (600 s by default) ends the process with the error, since wgpu's
//! device cannot be dropped while its GPU hangs; progress and notes go to stderr unless
//! `RunOptions::progress` is off (warnings always do); `ZEROSTREAM_TUNE_DIR` (or the user's cache
//! directory) holds the tuning tables read at device opening; under an MPI launcher's environment
//! (`OMPI_*`, `PMI_*`) `launch` runs as one of its ranks; no signal handler is installed.
//!
//! To read the code, start at [`device::Backend`] (the ops every device implements), then
//! [`model::gpt2`] (GPT-2's forward and backward written against that trait). `docs/ARCHITECTURE.md`
//! has the map of the whole project.

pub mod bench;
pub mod comm;
pub mod device;
pub mod eval;
pub mod generate;
pub mod model;
pub mod ops;
#[cfg(feature = "plot")]
pub mod plot;
pub(crate) mod progress;
pub mod selftest;
pub mod train;
pub mod words;

/// The model, data and checkpoint formats (the `zerostream-checkpoints` crate).
pub use zerostream_checkpoints as checkpoints;
/// Host-memory tiers, NVMe I/O and the CPU AdamW (the `zerostream-offload` crate).
pub use zerostream_offload as offload;

pub use device::{AnyDevice, Backend, DeviceChoice};
pub use eval::{EvalData, EvalReport, evaluate_on};
pub use generate::{Sampling, generate};
pub use model::Model;
pub use train::run::{CheckpointOptions, ModelChoice, RunOptions, RunSummary, run_on};
pub use train::{LrPlan, LrSchedule, ModelSource, Precision, SaveDtype, StepReport, TrainConfig, Trainer, ZeroStage};

/// What a program that trains, evaluates or samples needs, in one `use zerostream::prelude::*;`.
pub mod prelude {
    pub use crate::checkpoints::{DataTokenizer, HfModel, TokenFile, TokenWidth, Tokenizer};
    pub use crate::device::{self, AnyDevice, Backend, DeviceChoice};
    pub use crate::offload::{IoConfig, IoEngineKind, Tier};
    pub use crate::{
        CheckpointOptions, EvalData, EvalReport, LrPlan, LrSchedule, Model, ModelChoice, ModelSource, Precision, RunOptions, RunSummary,
        Sampling, SaveDtype, StepReport, TrainConfig, Trainer, ZeroStage, evaluate_on, generate, run_on,
    };
}
