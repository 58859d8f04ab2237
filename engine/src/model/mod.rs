//! The model seam. A model family is one module here (its config, ONE declarative table of its
//! tensors per parameter group, and its forward and backward as kernel calls on
//! [`crate::device::Backend`]) plus a variant of [`Model`]; the trainer, the plan, the layout, the
//! checkpoints and Hugging Face import/export work from [`Model`] and name no family. Adding a family
//! means its module, its kernels and its golden test (`engine/tests/model_seam.rs` checks that no
//! module outside `model/` names one).

pub mod decode;
pub mod gpt2;
pub mod llama;
mod passes;
mod seam;
pub mod vocab;

pub use seam::{BlockActs, HeadActs, Model};

/// One parameter tensor: a row of a family's table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    /// Hugging Face name (`transformer.h.0.attn.c_attn.weight`).
    pub name: String,
    pub shape: Vec<usize>,
    /// Whether decoupled weight decay applies to it.
    pub decay: bool,
}

impl TensorSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Declares a family's parameter group as one table: each row a field (in group order) with its
/// Hugging Face name, its shape in terms of the config and whether weight decay applies. From it come
/// the struct (generic over the tensor type: device tensors, host vectors, references), its
/// [`TensorSpec`]s, and conversions from and to the group's flat list of tensors.
#[macro_export]
macro_rules! tensor_group {
    ($(#[$meta:meta])* pub struct $name:ident, config $c:ident: $cfg:ty {
        $($field:ident => $hf:literal, [$($dim:expr),*], $decay:ident;)*
    }) => {
        $(#[$meta])*
        pub struct $name<T> {
            $(pub $field: T,)*
        }

        impl<T> $name<T> {
            /// The group's tensors in table order, named `{prefix}{Hugging Face name}`.
            pub fn specs($c: &$cfg, prefix: &str) -> Vec<$crate::model::TensorSpec> {
                vec![$($crate::model::TensorSpec {
                    name: format!("{prefix}{}", $hf),
                    shape: vec![$($dim),*],
                    decay: $crate::tensor_group!(@decay $decay),
                },)*]
            }
            /// The group from its tensors in table order.
            pub fn from_tensors(t: Vec<T>) -> Self {
                let n = t.len();
                let mut it = t.into_iter();
                let group = $name { $($field: it.next().unwrap_or_else(|| panic!("{}: {n} tensors given", stringify!($name))),)* };
                assert!(it.next().is_none(), "{}: {n} tensors given", stringify!($name));
                group
            }
            /// The group's tensors in table order.
            pub fn tensors(&self) -> Vec<&T> {
                vec![$(&self.$field,)*]
            }
            /// A view of the group's tensors given in table order.
            pub fn view(t: &[T]) -> $name<&T> {
                let n = t.len();
                let mut it = t.iter();
                let group = $name { $($field: it.next().unwrap_or_else(|| panic!("{}: {n} tensors given", stringify!($name))),)* };
                assert!(it.next().is_none(), "{}: {n} tensors given", stringify!($name));
                group
            }
            /// The group as references.
            pub fn refs(&self) -> $name<&T> {
                $name { $($field: &self.$field,)* }
            }
        }
    };
    (@decay decay) => { true };
    (@decay no_decay) => { false };
}
