#!/usr/bin/env bash
# benches/fio_vs_bench_io.sh: zerostream's NVMe path (`zerostream bench io`, the engine the trainer's NVMe
# tier uses) against fio on the same directory, file size, block size and queue depth, in one run
# (issue #13: NVMe >= 0.9x fio, in read and in write).
#
# Each round runs fio (io_uring, O_DIRECT, sequential write then sequential read of one file, end_fsync) and
# `zerostream bench io` (io_uring, O_DIRECT, write then read, fsync after the write), alternating which goes
# first, and prints each side's GB/s and the ratio zerostream / fio per round; then the medians.
# fio runs with its defaults for io_uring (no fixed buffers, no registered files, no SQ polling): the plain
# reference any user can run.
#
# Usage:  bash benches/fio_vs_bench_io.sh [DIR]
# Environment (all optional):
#   DIR        directory on the drive to measure (default: the current directory); the first argument wins
#   SIZE       bytes per file, fio's spelling (default 1G; zerostream is given the same number of bytes)
#   BS         block size in bytes (default 1048576)
#   QD         queue depth (default 32)
#   ROUNDS     rounds (default 4)
#   ZS         a zerostream binary to use instead of building one
#   CARGO_TARGET_DIR  where cargo builds (default ./target)
# fio is installed with apt-get when missing. The load of the machine is printed with every round: other
# work on the machine or on the host of a virtual disk moves both sides, so compare within a round.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-${DIR:-.}}
size=${SIZE:-1G}
bs=${BS:-1048576}
qd=${QD:-32}
rounds=${ROUNDS:-4}
size_bytes=$(numfmt --from=iec "$size")

if ! command -v fio >/dev/null; then
  echo "fio not found: installing it with apt-get" >&2
  apt-get install -y fio >/dev/null || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi
command -v jq >/dev/null || { echo "jq is needed to read the JSON (apt-get install jq)" >&2; exit 1; }
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
mkdir -p "$dir"
fio_file="$dir/zerostream-fio-$$.bin"
trap 'rm -f "$fio_file"' EXIT

echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Hypervisor vendor)' || true
echo "directory: $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' ')"
echo "kernel: $(uname -r); $(fio --version); zerostream: $ZS ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "size $size_bytes bytes, block $bs bytes, queue depth $qd, $rounds rounds"

fio_one() { # rw -> GB/s
  fio --name=zerostream-vs-fio --filename="$fio_file" --rw="$1" --bs="$bs" --iodepth="$qd" --ioengine=io_uring \
    --direct=1 --size="$size_bytes" --end_fsync=1 --output-format=json |
    jq -r --arg rw "$1" '.jobs[0][$rw].bw_bytes / 1e9'
}
fio_pair() { # -> "write read"
  local w r
  w=$(fio_one write)
  r=$(fio_one read)
  rm -f "$fio_file"
  echo "$w $r"
}
zs_pair() { # -> "write read"
  "$ZS" bench io --dir "$dir" --size "$size_bytes" --block-size "$bs" --queue-depth "$qd" --io-engine uring --json |
    jq -r '.runs[0] | "\(.write_gbps) \(.read_gbps) \(.direct)"'
}

ratios_w=()
ratios_r=()
printf '%-6s %-10s %10s %10s %10s %10s %8s %8s  %s\n' round first zs_write fio_write zs_read fio_read w_ratio r_ratio load
for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then
    first=fio
    read -r fw fr <<<"$(fio_pair)"
    read -r zw zr direct <<<"$(zs_pair)"
  else
    first=zerostream
    read -r zw zr direct <<<"$(zs_pair)"
    read -r fw fr <<<"$(fio_pair)"
  fi
  [ "$direct" = true ] || echo "warning: zerostream fell back to buffered I/O (O_DIRECT refused): not comparable" >&2
  rw=$(awk -v a="$zw" -v b="$fw" 'BEGIN {print a / b}')
  rr=$(awk -v a="$zr" -v b="$fr" 'BEGIN {print a / b}')
  ratios_w+=("$rw")
  ratios_r+=("$rr")
  printf '%-6s %-10s %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f  %s\n' "$i" "$first" "$zw" "$fw" "$zr" "$fr" "$rw" "$rr" \
    "$(uptime | sed 's/.*load average: //')"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf 'median ratio zerostream/fio: write %.2f, read %.2f (min write %.2f, min read %.2f)\n' \
  "$(median "${ratios_w[@]}")" "$(median "${ratios_r[@]}")" \
  "$(printf '%s\n' "${ratios_w[@]}" | sort -g | head -1)" "$(printf '%s\n' "${ratios_r[@]}" | sort -g | head -1)"
