#!/usr/bin/env bash
# benches/gpu-prepare.sh: everything a session with a lent GPU machine needs before its first call,
# built here (x86-64, like the GPU machine): the release binary, stripped to fit the carried tree's
# 64 MiB (the debug line tables make it ~90 MB), and the GPU test executables, packed, in .device/; the
# Vulkan loader's .deb files in .gl/ (the GPU machine has NVIDIA's driver but no loader and no package
# access). Both folders are kept out of git.
# It ends by printing the one command to give the device tool (`run`), with its carry list.
#
# Usage: bash benches/gpu-prepare.sh        (from the repository root; needs cargo, strip, apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_TESTS="train transfer golden golden_llama gpu_busy"
for ignored in /.device/ /.gl/; do
  grep -qxF "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >>.git/info/exclude
done
cargo build --release -p zerostream --bin zerostream
mkdir -p .device
strip -o .device/zerostream target/release/zerostream
# The GPU tests that only a real GPU can settle (cross-queue order under --copy-queue, timestamps, the
# goldens on that adapter), stripped and packed (xz: a third of their size); gpu.sh runs them.
tests=$(mktemp -d)
trap 'rm -rf "$tests"' EXIT
cargo test --release -p zerostream --no-run --message-format=json $(printf -- '--test %s ' $GPU_TESTS) |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
  while read -r name exe; do strip -o "$tests/$name" "$exe"; done
[ "$(ls "$tests" | wc -l)" -eq "$(echo $GPU_TESTS | wc -w)" ] || { echo "gpu-prepare: test executables missing: $(ls "$tests")" >&2; exit 1; }
tar -C "$tests" -cJf .device/tests.tar.xz .
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  lists=$(mktemp -d); mkdir -p .gl "$lists/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$lists"
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .device .gl
echo
echo "device tool: run with carry [\".device\", \".gl\"] and timeout_s 600, command:"
echo 'for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp; ZS=.device/zerostream bash benches/gpu.sh $OUT/results.md'
echo "It writes results.md, results.json (the goals) and results.raw.txt under \$OUT; commit them to"
echo "benches/results/<date>-<gpu>-gpu.{md,json} with the machine named before anything else."
