#!/usr/bin/env bash
# benches/sweep_vs_fio.sh: the trainer's NVMe tier (the update's sweep: read a group's gradient, master
# weights and moments ahead, write the previous group's back, both at once) against fio reading one file
# and writing another at the same time, on the same directory, rounds alternating (issue #13, item 2).
#
# Usage:  bash benches/sweep_vs_fio.sh DIR [ROUNDS]
#   DIR     a directory on the drive to measure (needs ~6 GB free)
#   ROUNDS  default 3
#   SWEEP_BINS  optional: "label=path label=path ...", prebuilt sweep_throughput test binaries (e.g. of
#           an older commit, for a before/after in the same run); default: this tree's, built here.
# The sweep side is offload/tests/sweep_throughput.rs (8 groups x 32M parameters, checksums on, the
# second of two sweeps); fio runs two jobs at once, 1 GiB files each, 1 MiB blocks, queue depth 32,
# O_DIRECT, io_uring (what the sweep's reads and writes use), for FIO_SECONDS (default 6, about as long
# as a sweep; a 1 GiB pass alone takes 1-2 s, where this disk's noise swamps the result; FIO_SECONDS=0
# gives that single pass). Each round runs fio and every binary, in an order
# that rotates from round to round. Installs fio with apt if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bash benches/sweep_vs_fio.sh DIR [ROUNDS]}
rounds=${2:-3}
command -v fio > /dev/null || { apt-get install -y fio > /dev/null || { echo "fio is missing and could not be installed" >&2; exit 1; }; }
mkdir -p "$dir"
work=$(mktemp -d -p "$dir")
trap 'rm -rf "$work"' EXIT
if [ -z "${SWEEP_BINS:-}" ]; then
  bin=$(cargo test --release -p zerostream-offload --test sweep_throughput --no-run 2>&1 | sed -n 's/.*Executable.*(\(.*\))/\1/p')
  SWEEP_BINS="current=$bin"
fi
read -r -a bins <<< "$SWEEP_BINS"

fio_mixed() {
  local timed=(--time_based --runtime="${FIO_SECONDS:-6}")
  [ "${FIO_SECONDS:-6}" = 0 ] && timed=() # one pass over each 1 GiB file (this script's first form)
  fio --output-format=terse --terse-version=3 --directory="$work" --size=1G --bs=1M --iodepth=32 \
    "${timed[@]}" --ioengine=io_uring --direct=1 --name=r --filename=r.bin --rw=read --name=w --filename=w.bin --rw=write \
    | awk -F';' '{ r += $7; w += $48 } END { printf "%.2f %.2f\n", r * 1024 / 1e9, w * 1024 / 1e9 }'
}
sweep() { # $1: the test binary; prints "read written" GB/s of the second sweep with checksums on
  SWEEP_DIR="$work" "$1" --ignored --nocapture --test-threads=1 2> /dev/null \
    | sed -n 's/^sweep 1 (verify true).*read \([0-9.]*\) GB\/s, written \([0-9.]*\) GB\/s.*/\1 \2/p'
}
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; disk: $(df -h "$dir" | tail -1)"
header="| round | load | fio read+write GB/s |"
rule="|---|---|---:|"
for b in "${bins[@]}"; do header+=" ${b%%=*} read+write GB/s | ratio |"; rule+="---:|---:|"; done
echo "$header"
echo "$rule"
jobs=("fio" "${bins[@]}")
for round in $(seq "$rounds"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  declare -A got=()
  n=${#jobs[@]}
  for i in $(seq 0 $((n - 1))); do
    job=${jobs[$(((i + round - 1) % n))]}
    if [ "$job" = fio ]; then got[fio]=$(fio_mixed | tr ' ' ,); else got[$job]=$(sweep "${job#*=}" | tr ' ' ,); fi
  done
  row=$(python3 -c "
import sys
r, w = map(float, sys.argv[1].split(','))
print(f'| $round | $load | {r:.2f}+{w:.2f} = {r + w:.2f} |', end='')
for s in sys.argv[2:]:
    sr, sw = map(float, s.split(','))
    print(f' {sr:.2f}+{sw:.2f} = {sr + sw:.2f} | {(sr + sw) / (r + w):.2f} |', end='')
print()" "${got[fio]}" $(for b in "${bins[@]}"; do echo "${got[$b]}"; done))
  echo "$row"
  unset got
done
