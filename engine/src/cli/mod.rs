//! The subcommands with the most flags, one file each; `main.rs` holds the command table and the small ones.

pub mod bench;
pub mod config_file;
pub mod generate;
pub mod prepare;
pub mod selftest;
pub mod train;
pub mod tune;
