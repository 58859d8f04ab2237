#!/usr/bin/env bash
# benches/gpu-tests.sh: runs the GPU test executables that benches/gpu-prepare.sh packed (a .tar.xz)
# on this machine's adapter, with ZEROSTREAM_REQUIRE_GPU=1, each from the engine folder as cargo would
# run it (their golden data lies there). Prints "### <name>" before each one's output; exits 1 if any
# failed. gpu.sh runs it as its `tests` part.
#
# Usage: bash benches/gpu-tests.sh TESTS.tar.xz UNPACK_DIR
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bash benches/gpu-tests.sh TESTS.tar.xz UNPACK_DIR" >&2; exit 2; }
packed=$1 dir=$2
mkdir -p "$dir" && tar -C "$dir" -xJf "$packed" || { echo "gpu-tests: cannot unpack $packed into $dir" >&2; exit 3; }
dir=$(cd "$dir" && pwd)
cd "$(dirname "$0")/../engine" || exit 3
rc=0
for t in "$dir"/*; do
  echo "### ${t##*/}"
  ZEROSTREAM_REQUIRE_GPU=1 "$t" --test-threads 4 2>&1 || rc=1
done
exit $rc
