//! How the model's parameters are grouped for streaming: group 0 is the head (the tensors outside the
//! blocks: embeddings, final norm, lm_head), group 1 + l is transformer block l, each in the order of
//! its family's table. Each group is one flat f32 buffer on the host; a tensor is a range of it.

use crate::model::{Model, TensorSpec};

/// One parameter tensor inside its group's flat buffer.
#[derive(Clone, Debug)]
pub struct TensorSlot {
    /// Hugging Face name (`transformer.h.0.attn.c_attn.weight`).
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the group.
    pub offset: usize,
    pub len: usize,
    /// Whether weight decay applies (the family's table says).
    pub decay: bool,
}

impl TensorSlot {
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The tensors of one group, in the order of the family's table.
#[derive(Clone, Debug)]
pub struct GroupLayout {
    /// `head` or `h.{l}`: names the group's files on the NVMe tier.
    pub name: String,
    pub tensors: Vec<TensorSlot>,
    /// Elements in the group.
    pub len: usize,
}

impl GroupLayout {
    fn new(name: String, specs: Vec<TensorSpec>) -> Self {
        let mut offset = 0;
        let tensors = specs
            .into_iter()
            .map(|t| {
                let len = t.len();
                let slot = TensorSlot { name: t.name, shape: t.shape, offset, len, decay: t.decay };
                offset += len;
                slot
            })
            .collect();
        GroupLayout { name, tensors, len: offset }
    }
}

/// The head group, then one group per block.
pub fn group_layouts(model: &Model) -> Vec<GroupLayout> {
    let mut groups = vec![GroupLayout::new("head".into(), model.head_specs())];
    for l in 0..model.n_layer() {
        groups.push(GroupLayout::new(format!("h.{l}"), model.block_specs(l)));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_cover_every_parameter_once_with_decay_on_matrices_only() {
        let model = Model::preset("gpt2").unwrap();
        let groups = group_layouts(&model);
        assert_eq!(groups.len(), 13);
        let total: usize = groups.iter().map(|g| g.len).sum();
        assert_eq!(total, 124_439_808, "GPT-2 small has 124,439,808 parameters");
        let mut names: Vec<_> = groups.iter().flat_map(|g| g.tensors.iter().map(|t| t.name.clone())).collect();
        names.sort();
        let mut want: Vec<_> = model.checkpoint_specs().into_iter().map(|t| t.name).collect();
        want.sort();
        assert_eq!(names, want);
        let block = &groups[1];
        assert_eq!(block.tensors.iter().filter(|t| t.decay).count(), 4, "c_attn, attn.c_proj, c_fc, mlp.c_proj");
        assert!(groups[0].tensors[0].decay && !groups[0].tensors[2].decay);
        // The golden contract: decay on every 2-D tensor and only there.
        assert!(groups.iter().flat_map(|g| &g.tensors).all(|t| t.decay == (t.shape.len() >= 2)));
    }
}
