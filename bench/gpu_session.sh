#!/usr/bin/env bash
# One call that makes a lent GPU machine (the `device` tool) measure, not install.
#
#   bash bench/gpu_session.sh wheels   # HERE, once: fetch the wheels the GPU machine lacks into .whl/
#   device run (carry [".whl"]):  bash bench/gpu_session.sh run
#
# The GPU machine has python3 3.12 with torch+CUDA, accelerate, transformers, peft, nvidia-ml-py, rich and
# psutil, and reaches no package index: what it lacks travels as wheels in .whl/ (git-ignored), installed
# into /tmp/site with --no-deps; the project itself runs from the working tree (PYTHONPATH), never installed.
# `run` executes the gpu-marked tests and bench/gpu_checks.py, and leaves everything under $OUT
# (gpu-results.json, gpu-session.log). Record the figures in BENCHMARKS.md.
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(sqlalchemy==2.1.9 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
        typing-extensions==4.16.0 textual==8.2.8 platformdirs==4.14.7 alembic==1.20.1 mako==1.4.3
        mdit-py-plugins==0.7.0 linkify-it-py==2.2.0 uc-micro-py==1.0.3 pytest-asyncio==1.5.0)

case "${1:-}" in
  wheels)
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    for w in "${WHEELS[@]}"; do
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$w" || echo "missing: $w"
    done
    du -sh .whl
    ;;
  run)
    OUT="${OUT:-/tmp/gpu-out}"; mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu-session.log") 2>&1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 FTUI_HOME=/tmp/ftui-home
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0))"
    python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -15
    python3 bench/gpu_checks.py --out "$OUT/gpu-results.json"
    ;;
  *)
    echo "usage: bash bench/gpu_session.sh wheels|run" >&2; exit 2 ;;
esac
