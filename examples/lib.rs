//! Examples live beside this file as `NN_name.rs`; this library is empty on purpose.
