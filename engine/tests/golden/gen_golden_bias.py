"""Golden forward/backward data for the Llama family's biases, produced by PyTorch + transformers.

Two tiny models over the llama-tiny token file (vocabulary 256): `qwen2-tiny` (Qwen2ForCausalLM: biases on
q, k and v) and `llama-bias-tiny` (LlamaForCausalLM with attention_bias and mlp_bias: biases on q, k, v, o,
gate, up and down). Norm weights and biases are perturbed away from their initial 1 and 0 so a kernel that
ignores them fails. Writes, per model: model/ (save_pretrained), golden.safetensors (float64, from the float32
weights: x, y (int32, (4, 16)), loss, logits, grad.{name}), golden.json (the settings).

    python gen_golden_bias.py --tokens llama-tiny/tokens.bin --out .
"""
import argparse, copy, json, os
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--tokens", required=True)
p.add_argument("--out", required=True)
a = p.parse_args()

common = dict(vocab_size=256, hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
              hidden_act="silu", tie_word_embeddings=False, attention_dropout=0.0,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
models = {
    "qwen2-tiny": lambda: Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False)),
    "llama-bias-tiny": lambda: LlamaForCausalLM(LlamaConfig(**common, head_dim=12, attention_bias=True, mlp_bias=True)),
}
header = np.fromfile(a.tokens, dtype=np.int32, count=256)
assert header[0] == 20240801 and header[1] == 7
tokens = torch.from_numpy(np.fromfile(a.tokens, dtype=np.uint32, offset=1024).astype(np.int64))
B, T = 4, 16
x, y = tokens[: B * T].view(B, T), tokens[1 : B * T + 1].view(B, T)
for name, make in models.items():
    torch.manual_seed(99)
    model = make().float().eval()
    with torch.no_grad():
        for n, prm in model.named_parameters():
            if n.endswith("norm.weight") or n.endswith(".bias"):
                prm.add_(0.1 * torch.randn_like(prm))
    out = os.path.join(a.out, name)
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    m64 = copy.deepcopy(model).double()
    logits = m64(x).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    tensors = {"x": x.to(torch.int32), "y": y.to(torch.int32), "loss": loss.detach().reshape(1), "logits": logits.detach().contiguous()}
    for n, prm in m64.named_parameters():
        tensors[f"grad.{n}"] = prm.grad.detach().contiguous()
    save_file(tensors, os.path.join(out, "golden.safetensors"))
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"model": name, "batch": B, "seq": T, "loss": loss.item(), "torch": torch.__version__,
                   "transformers": __import__("transformers").__version__}, f, indent=1)
    print(name, "loss", loss.item(), "params", sum(p.numel() for p in model.parameters()))
