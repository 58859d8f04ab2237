#!/usr/bin/env bash
# benches/io_engines.sh: the portable threads engine against io_uring (`zerostream bench io`, the engines the
# trainer's NVMe tier uses) on the same directory, file size, block size and queue depth (issue #26: the
# portable engine beside io_uring, and io_uring no slower than before).
#
# Each round runs `bench io` once per engine (uncached, sequential write then read of one file, fsync after
# the write), alternating which goes first, and prints each side's GB/s and the ratio threads / uring; then
# the medians. Every block size and queue depth given is measured in its own set of rounds.
#
# Usage:  bash benches/io_engines.sh [DIR]
# Environment (all optional):
#   DIR        directory on the drive to measure (default: the current directory); the first argument wins
#   SIZE       bytes per file (default 1GiB)
#   BS         block sizes, space-separated (default "1MiB 256KiB")
#   QD         queue depths, space-separated (default "32 8")
#   ROUNDS     rounds per block size and depth (default 5)
#   ZS         a zerostream binary to use instead of building one
#   CARGO_TARGET_DIR  where cargo builds (default ./target)
# The load of the machine is printed with every round: other work on the machine or on the host of a
# virtual disk moves both sides, so compare within a round.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-${DIR:-.}}
size=${SIZE:-1GiB}
block_sizes=${BS:-1MiB 256KiB}
depths=${QD:-32 8}
rounds=${ROUNDS:-5}

command -v jq >/dev/null || { echo "jq is needed to read the JSON (apt-get install jq)" >&2; exit 1; }
if [ -z "${ZS:-}" ]; then
  cargo build --release -p zerostream
  ZS=${CARGO_TARGET_DIR:-target}/release/zerostream
fi
mkdir -p "$dir"

echo "== machine"
lscpu | grep -E '^(Model name|CPU\(s\)|Hypervisor vendor)' || true
echo "directory: $dir on $(df --output=source,fstype "$dir" | tail -1 | tr -s ' ')"
echo "kernel: $(uname -r); zerostream: $ZS ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "size $size, block sizes $block_sizes, queue depths $depths, $rounds rounds each"

one() { # engine bs qd -> "write read kind"
  "$ZS" bench io --dir "$dir" --size "$size" --block-size "$2" --queue-depth "$3" --io-engine "$1" --json |
    jq -r '.runs[0] | "\(.write_gbps) \(.read_gbps) \(.kind)"'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for bs in $block_sizes; do
  for qd in $depths; do
    echo "== block $bs, queue depth $qd"
    ratios_w=() ratios_r=() uw_all=() ur_all=() tw_all=() tr_all=()
    printf '%-6s %-8s %10s %10s %10s %10s %8s %8s  %s\n' round first uring_w threads_w uring_r threads_r w_ratio r_ratio load
    for i in $(seq 1 "$rounds"); do
      if [ $((i % 2)) -eq 1 ]; then
        first=uring
        read -r uw ur ukind <<<"$(one uring "$bs" "$qd")"
        read -r tw tr tkind <<<"$(one threads "$bs" "$qd")"
      else
        first=threads
        read -r tw tr tkind <<<"$(one threads "$bs" "$qd")"
        read -r uw ur ukind <<<"$(one uring "$bs" "$qd")"
      fi
      [ "$ukind" = "$tkind" ] || echo "warning: the engines ran as $ukind and $tkind: not comparable" >&2
      rw=$(awk -v a="$tw" -v b="$uw" 'BEGIN {print a / b}')
      rr=$(awk -v a="$tr" -v b="$ur" 'BEGIN {print a / b}')
      ratios_w+=("$rw") ratios_r+=("$rr") uw_all+=("$uw") ur_all+=("$ur") tw_all+=("$tw") tr_all+=("$tr")
      printf '%-6s %-8s %10.3f %10.3f %10.3f %10.3f %8.2f %8.2f  %s\n' "$i" "$first" "$uw" "$tw" "$ur" "$tr" "$rw" "$rr" \
        "$(uptime | sed 's/.*load average: //')"
    done
    printf 'median GB/s: uring write %.2f read %.2f, threads write %.2f read %.2f; median ratio threads/uring: write %.2f, read %.2f\n' \
      "$(median "${uw_all[@]}")" "$(median "${ur_all[@]}")" "$(median "${tw_all[@]}")" "$(median "${tr_all[@]}")" \
      "$(median "${ratios_w[@]}")" "$(median "${ratios_r[@]}")"
  done
done
