#!/usr/bin/env bash
# name config steps bs extra...   (cpu device, T=64, bf16, recompute, minimum budget unless given)
set -uo pipefail
cd /work/main
ZS=${ZS:-/work/p2/zerostream}
name=$1; config=$2; steps=$3; bs=$4; shift 4
common=(--device cpu --config "$config" --data /work/scale/hamlet.bin --batch-size "$bs" --seq-len 64 --precision bf16 --nvme-dir /work/scale/nvme "$@")
budget=$( ("$ZS" plan "${common[@]}" --gpu-mem-budget 1 2>&1 || true) | sed -n 's/.*the minimum of \([0-9]*\) bytes.*/\1/p')
echo "== $name budget $budget $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
"$ZS" plan --measure "${common[@]}" --gpu-mem-budget "$budget" > /work/p2/$name.plan.txt 2>&1
grep -o "predicted steady step.*" /work/p2/$name.plan.txt
/usr/bin/time -v -o /work/p2/$name.time.txt "$ZS" train "${common[@]}" --gpu-mem-budget "$budget" --steps "$steps" --warmup-steps 1 --sample-tokens 0 --eval-every 0 --metrics /work/p2/$name.jsonl > /work/p2/$name.log 2>&1
rm -rf /work/scale/nvme/rank*
grep -E "Maximum resident|Elapsed" /work/p2/$name.time.txt
python3 - /work/p2/$name.jsonl <<'PY'
import json,sys
rows=[r for r in map(json.loads, open(sys.argv[1])) if 'time' in r]
for r in rows:
    t=r['time']; print(r['step'], round(t['total_s'],2), 'compute',round(t['device_compute_s'],2),'fwd',round(t.get('forward_device_s',0) or 0,2),'up',round(t['upload_s'],2),'io',round(t['io_wait_s'],2),'uw',round(t['update_wait_s'],2),'adam',round(t['adam_s'],2), 'rd',round(r['nvme_read_bytes']/1e9,2),'wr',round(r['nvme_written_bytes']/1e9,2),'pred',round(r.get('predicted_step_s') or 0,2))
st=[r['time']['total_s'] for r in rows[2:]]
if st:
    import statistics; m=statistics.median(st); p=rows[-1].get('predicted_step_s') or 0
    print(f"SUMMARY {sys.argv[1]} median_steady {m:.3f} predicted {p:.3f} err {100*(p-m)/m:+.0f}%")
PY
