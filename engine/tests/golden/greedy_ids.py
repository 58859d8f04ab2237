import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
prompt = torch.tensor([[int(t) for t in sys.argv[2].split(",")]])
out = m.generate(prompt, max_new_tokens=int(sys.argv[3]), do_sample=False, pad_token_id=0, eos_token_id=None)
print(",".join(str(t) for t in out[0, prompt.shape[1]:].tolist()))
