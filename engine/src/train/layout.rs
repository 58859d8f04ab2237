//! How the model's parameters are grouped for streaming: group 0 is the head (wte, wpe, ln_f), group
//! 1 + l is transformer block l. Each group is one flat f32 buffer on the host; a tensor is a range of it.

use crate::model::gpt2::{Gpt2Config, parameter_specs};

/// One parameter tensor inside its group's flat buffer.
#[derive(Clone, Debug)]
pub struct TensorSlot {
    /// Hugging Face name (`transformer.h.0.attn.c_attn.weight`).
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the group.
    pub offset: usize,
    pub len: usize,
}

impl TensorSlot {
    /// Weight decay applies to tensors of two or more dimensions only (not biases or layer norms).
    pub fn decays(&self) -> bool {
        self.shape.len() >= 2
    }
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The tensors of one group, in the order the model's `Head::tensors` / `Block::tensors` give them.
#[derive(Clone, Debug)]
pub struct GroupLayout {
    /// `head` or `h.{l}`: names the group's files on the NVMe tier.
    pub name: String,
    pub tensors: Vec<TensorSlot>,
    /// Elements in the group.
    pub len: usize,
}

impl GroupLayout {
    fn new(name: String, specs: Vec<(String, Vec<usize>)>) -> Self {
        let mut offset = 0;
        let tensors = specs
            .into_iter()
            .map(|(name, shape)| {
                let len = shape.iter().product();
                let slot = TensorSlot { name, shape, offset, len };
                offset += len;
                slot
            })
            .collect();
        GroupLayout { name, tensors, len: offset }
    }
}

/// The head group, then one group per block.
pub fn group_layouts(cfg: &Gpt2Config) -> Vec<GroupLayout> {
    let specs = parameter_specs(cfg);
    // parameter_specs is checkpoint order: wte, wpe, 12 per block, ln_f.weight, ln_f.bias.
    let n = specs.len();
    let head = vec![specs[0].clone(), specs[1].clone(), specs[n - 2].clone(), specs[n - 1].clone()];
    let mut groups = vec![GroupLayout::new("head".into(), head)];
    for l in 0..cfg.n_layer {
        let block = specs[2 + 12 * l..2 + 12 * (l + 1)].to_vec();
        groups.push(GroupLayout::new(format!("h.{l}"), block));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_every_parameter_once_with_decay_on_matrices_only() {
        let cfg = Gpt2Config::preset("gpt2").unwrap();
        let groups = group_layouts(&cfg);
        assert_eq!(groups.len(), 13);
        let total: usize = groups.iter().map(|g| g.len).sum();
        assert_eq!(total, 124_439_808, "GPT-2 small has 124,439,808 parameters");
        let mut names: Vec<_> = groups.iter().flat_map(|g| g.tensors.iter().map(|t| t.name.clone())).collect();
        names.sort();
        let mut want: Vec<_> = parameter_specs(&cfg).into_iter().map(|(n, _)| n).collect();
        want.sort();
        assert_eq!(names, want);
        let block = &groups[1];
        assert_eq!(block.tensors.iter().filter(|t| t.decays()).count(), 4, "c_attn, attn.c_proj, c_fc, mlp.c_proj");
        assert!(groups[0].tensors[0].decays() && !groups[0].tensors[2].decays());
    }
}
