#!/usr/bin/env bash
# Install PyTorch into the active Python environment, choosing the wheel for this machine:
# - an NVIDIA GPU present (nvidia-smi works): the default CUDA build from PyPI;
# - otherwise a CPU-only build: a local +cpu wheel from pip's find-links when there is one,
#   else PyTorch's CPU index. TORCH_SPEC overrides everything (e.g. TORCH_SPEC="torch==2.5.1").
set -euo pipefail
PIP="${PIP:-python -m pip}"
if [ -n "${TORCH_SPEC:-}" ]; then
  exec $PIP install "$TORCH_SPEC"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "install_torch: NVIDIA GPU found, installing the CUDA build"
  exec $PIP install "torch>=2.4"
fi
links="$($PIP config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}"
for dir in $links; do
  dir="${dir#file://}"
  [ -d "$dir" ] || continue
  wheel=$(ls "$dir"/torch-*+cpu-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$wheel" ]; then
    version=$(basename "$wheel" | cut -d- -f2)
    echo "install_torch: no GPU, installing local CPU wheel torch==$version"
    exec $PIP install "torch==$version"
  fi
done
echo "install_torch: no GPU, installing the CPU build from PyTorch's CPU index"
exec $PIP install "torch>=2.4" --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple
