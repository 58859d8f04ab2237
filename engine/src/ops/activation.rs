//! The MLP activations a GPT-2 config may name (`activation_function`), each a pair of elementwise
//! kernels with its own twin file: the tanh GELU ([`super::gelu`]), the exact GELU
//! ([`super::gelu_erf`]) and ReLU ([`super::relu`]).

/// One of the activations the engine implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): transformers' `gelu_new` and `gelu_pytorch_tanh`.
    GeluTanh,
    /// x Phi(x) with the normal CDF through erf: transformers' `gelu` (PyTorch's default GELU).
    GeluErf,
    /// max(x, 0): transformers' `relu`.
    Relu,
}

impl Activation {
    /// The activation transformers means by `activation_function = name`, if the engine implements it.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        match name {
            "gelu_new" | "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            "gelu" => Some(Activation::GeluErf),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    /// out = f(x), on the cpu.
    pub fn forward(self, out: &mut [f32], x: &[f32]) {
        match self {
            Activation::GeluTanh => super::gelu::gelu_forward(out, x),
            Activation::GeluErf => super::gelu_erf::gelu_erf_forward(out, x),
            Activation::Relu => super::relu::relu_forward(out, x),
        }
    }

    /// dx += dout * f'(x), on the cpu.
    pub fn backward(self, dx: &mut [f32], x: &[f32], dout: &[f32]) {
        match self {
            Activation::GeluTanh => super::gelu::gelu_backward(dx, x, dout),
            Activation::GeluErf => super::gelu_erf::gelu_erf_backward(dx, x, dout),
            Activation::Relu => super::relu::relu_backward(dx, x, dout),
        }
    }
}
