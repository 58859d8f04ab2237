import json, subprocess, sys, numpy as np, torch, torch.nn.functional as F, transformers, safetensors
from transformers import AutoModelForCausalLM
from safetensors import safe_open
torch.set_num_threads(1)
E="/work/main/engine/tests/golden"
def tokens(path):
    h=np.fromfile(path,dtype=np.int32,count=256)
    magic,ver,n=int(h[0]),int(h[1]),int(h[2])
    dt={ (20240520,1):np.uint16, (20240801,7):np.uint32 }[(magic,ver)]
    t=np.fromfile(path,dtype=dt,offset=256*4)
    return magic,ver,n,len(t),t.astype(np.int64)
cases=[("gpt2-saved","gpt2-tiny"),("gpt2-ckpt","gpt2-tiny"),("llama-saved","llama-tiny"),("llama-ckpt","llama-tiny"),("llama-bf16","llama-tiny"),
       ("ORIG gpt2-tiny/model","gpt2-tiny"),("ORIG llama-tiny/model","llama-tiny")]
res=[]
for name,g in cases:
    if name.startswith("ORIG"): d=f"{E}/{name.split()[1]}"
    else:
        d=f"/tmp/verify/{name}"
        if name.endswith("ckpt"): d=d+"/"+open(d+"/latest").read().strip()
    tok=f"{E}/{g}/tokens.bin"
    r={"name":name,"dir":d,"tokens":tok}
    try:
        with safe_open(d+"/model.safetensors","pt") as f:
            ks=list(f.keys()); r["st_dtypes"]=sorted({str(f.get_slice(k).get_dtype()) for k in ks}); r["st_nkeys"]=len(ks)
        m,info=AutoModelForCausalLM.from_pretrained(d,output_loading_info=True,dtype=torch.float32,attn_implementation="eager")
        r["info"]={k:(sorted(map(str,v)) if not isinstance(v,list) else [str(x) for x in v]) for k,v in info.items()}
        r["param_dtype"]=str(next(m.parameters()).dtype)
        m.eval()
        magic,ver,n,nt,t=tokens(tok); r["tok_hdr"]=(magic,ver,n,nt)
        x=torch.tensor(t[0:64]).view(4,16); y=torch.tensor(t[1:65]).view(4,16)
        with torch.no_grad():
            lg=m(x).logits.float()
            V=lg.shape[-1]
            r["torch_loss"]=F.cross_entropy(lg.reshape(-1,V),y.reshape(-1)).item()
    except Exception as e:
        import traceback; r["torch_error"]=traceback.format_exc()
    p=subprocess.run(["/tmp/zs","eval","--device","cpu","--model",d,"--data",tok,"--batch-size","4","--seq-len","16"],capture_output=True,text=True)
    r["zs_rc"]=p.returncode; r["zs_stdout"]=p.stdout.strip(); r["zs_stderr"]=p.stderr.strip()
    try:
        line=[l for l in p.stdout.splitlines() if l.strip().startswith("{")][-1]
        r["zs_json"]=json.loads(line); r["zs_loss"]=float(r["zs_json"]["loss"])
    except Exception as e: r["zs_parse_error"]=repr(e)
    if "torch_loss" in r and "zs_loss" in r:
        r["rel_diff"]=abs(r["torch_loss"]-r["zs_loss"])/abs(r["torch_loss"])
    res.append(r); print(json.dumps(r,indent=1),flush=True)
json.dump({"versions":{"python":sys.version.split()[0],"torch":torch.__version__,"transformers":transformers.__version__,"safetensors":safetensors.__version__,"numpy":np.__version__},"results":res},open("/tmp/verify/results.json","w"),indent=1)
