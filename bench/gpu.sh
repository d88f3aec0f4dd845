#!/usr/bin/env bash
# Both tokenrelay engines and `vllm serve` on one NVIDIA GPU: the Qwen2-0.5B shape in bf16
# at 64 and 256 concurrent streams, same client, same run (python -m bench.worker_throughput,
# modes d, e, f). For a machine without internet: everything installs from WHEELHOUSE, made
# beforehand on a machine with it (Linux x86_64, Python 3.11), from the repository root:
#
#   pip download -d WHEELHOUSE torch==2.13.0 setuptools '.[api,worker,client,embedded-redis]' psutil
#   pip download -d WHEELHOUSE/vllm torch==2.13.0 setuptools '.[vllm]'
#
# Usage: bench/gpu.sh WHEELHOUSE [extra bench.worker_throughput flags]. About 10 minutes:
# two installs from local wheels, a random-weight checkpoint, three servers, two cells each.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${1:?usage: bench/gpu.sh WHEELHOUSE [flags]; see the header for how to make it}
shift
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
install() {  # install VENV FOLDER EXTRAS...
  python3 -m venv "$1"
  "$1/bin/pip" install -q --no-index --find-links "$2" torch==2.13.0 -e ".[$3]" "${@:4}"
}
install .venv-gpu "$wheels" api,worker,client,embedded-redis psutil
install .venv-gpu-vllm "$wheels/vllm" vllm
.venv-gpu/bin/python -m bench.worker_throughput \
  --shapes qwen2-0.5b --dtype bfloat16 --device cuda --modes d,e,f \
  --concurrency 64,256 --repeats 1 --heavy-repeats 1 --stagger-requests 0 \
  --profile-concurrency "" --vllm-python .venv-gpu-vllm/bin/python "$@"
