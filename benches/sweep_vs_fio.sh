#!/usr/bin/env bash
# benches/sweep_vs_fio.sh: the trainer's NVMe tier (the update's sweep: read a group's gradient, master
# weights and moments ahead, write the previous group's back, both at once) against fio reading one file
# and writing another at the same time, on the same directory, rounds alternating (issue #13, item 2).
#
# Usage:  bash benches/sweep_vs_fio.sh DIR [ROUNDS]
#   DIR     a directory on the drive to measure (needs ~6 GB free)
#   ROUNDS  default 3
# The sweep side is offload/tests/sweep_throughput.rs (8 groups x 32M parameters, checksums on, the
# second of two sweeps); fio runs two jobs at once, 1 GiB each, 1 MiB blocks, queue depth 32, O_DIRECT,
# io_uring (what the sweep's reads and writes use). Installs fio with apt if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bash benches/sweep_vs_fio.sh DIR [ROUNDS]}
rounds=${2:-3}
command -v fio > /dev/null || { apt-get install -y fio > /dev/null || { echo "fio is missing and could not be installed" >&2; exit 1; }; }
mkdir -p "$dir"
work=$(mktemp -d -p "$dir")
trap 'rm -rf "$work"' EXIT
cargo test --release -p zerostream-offload --test sweep_throughput --no-run 2> /dev/null

fio_mixed() {
  fio --output-format=terse --terse-version=3 --directory="$work" --size=1G --bs=1M --iodepth=32 \
    --ioengine=io_uring --direct=1 --name=r --filename=r.bin --rw=read --name=w --filename=w.bin --rw=write \
    | awk -F';' '{ r += $7; w += $48 } END { printf "%.2f %.2f\n", r * 1024 / 1e9, w * 1024 / 1e9 }'
}
sweep() {
  SWEEP_DIR="$work" cargo test -q --release -p zerostream-offload --test sweep_throughput -- --ignored --nocapture 2> /dev/null \
    | sed -n 's/^sweep 1 (verify true).*read \([0-9.]*\) GB\/s, written \([0-9.]*\) GB\/s.*/\1 \2/p'
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; disk: $(df -h "$dir" | tail -1)"
echo "| round | load | sweep read GB/s | sweep write GB/s | sweep together | fio read GB/s | fio write GB/s | fio together | ratio |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for round in $(seq "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  if [ $((round % 2)) = 1 ]; then s=$(sweep); f=$(fio_mixed); else f=$(fio_mixed); s=$(sweep); fi
  read -r sr sw <<< "$s"
  read -r fr fw <<< "$f"
  python3 -c "
sr, sw, fr, fw = $sr, $sw, $fr, $fw
print(f'| $round | $load | {sr:.2f} | {sw:.2f} | {sr + sw:.2f} | {fr:.2f} | {fw:.2f} | {fr + fw:.2f} | {(sr + sw) / (fr + fw):.2f} |')"
done
