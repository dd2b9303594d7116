# syntax=docker/dockerfile:1
# The CUDA image of Ascent: the training environment of an NVIDIA GPU node (a Ray worker of a GPU
# cluster), with vLLM for `rollout.engine: vllm`. Its default command is the smoke run
# (deploy/smoke.sh on cuda); docs/images.md has the rest.
#   docker build -f deploy/cuda.Dockerfile -t ascent:cuda .
#   docker run --rm --gpus all ascent:cuda
#   docker build -f deploy/cuda.Dockerfile --build-arg INSTALL_FLASH_ATTN=1 -t ascent:cuda-fa .
#
# Versions: the `vllm` extra pins vLLM 0.32.0, whose CUDA wheel pins torch==2.13.0, the project's
# own pin. PyPI's torch 2.13.0 is the CUDA 13.0 build and brings the CUDA 13.0.3 runtime, cuDNN
# and NCCL as wheels (`cuda-toolkit==13.0.3` in its metadata), hence CUDA 13.0.3 here too; the
# host needs an NVIDIA driver for CUDA 13.0 (the 580 series or newer).
#
# Base: NVIDIA's CUDA image, not vllm/vllm-openai. vLLM's image is a resolved environment of its
# own (with the OpenAI server's extras), which the project's pins would have to be forced into;
# here the project is installed at its pins and vLLM moves only what it must (below). `devel` (the
# default flavour) has nvcc, with which FlashInfer (a vLLM dependency) compiles kernels at first
# use and flash-attn builds; `runtime` gives a smaller image without it.
ARG CUDA_VERSION=13.0.3
ARG CUDA_FLAVOR=devel
FROM nvidia/cuda:${CUDA_VERSION}-${CUDA_FLAVOR}-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    SMOKE_DEVICE=cuda
# Ubuntu 24.04's Python 3.12 in a virtual environment (the system one belongs to the
# distribution). A C compiler and Python's headers: Triton builds its launcher with them.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./

# The requirements, read from pyproject.toml: the project's dependencies with the `cuda` extra,
# and the `vllm` extra.
RUN python - <<'EOF'
import tomllib

with open("pyproject.toml", "rb") as file:
    project = tomllib.load(file)["project"]
extras = project["optional-dependencies"]
with open("/tmp/project.txt", "w") as out:
    out.writelines(f"{req}\n" for req in project["dependencies"] + extras["cuda"]
                   + extras["megatron"])
with open("/tmp/vllm.txt", "w") as out:
    out.writelines(f"{req}\n" for req in extras["vllm"])
EOF

# Those of the project at the versions constraints.txt pins (those of the CPU image and the
# tests), torch 2.13.0 among them, here PyPI's CUDA build. (A layer of its own, like vLLM's
# below, so that a failed vLLM install is retried without reinstalling these.)
# hadolint ignore=DL3059
RUN pip install --no-cache-dir -c constraints.txt -r /tmp/project.txt

# vLLM (the `vllm` extra), without constraints.txt: that file serves the CPU environment, where
# vLLM's CPU build is installed without its dependencies, and vLLM 0.32.0's CUDA build asks for
# other versions of a few of its pins (fastapi <0.137, numpy <2.4 through mistral-common,
# apache-tvm-ffi 0.1.11). pip keeps every installed version vLLM accepts (it upgrades only when
# needed), moves just those, and adds vLLM's own packages (FlashInfer, xgrammar, ...) at the
# versions vLLM asks for; `pip check` at the end proves the whole set consistent.
# hadolint ignore=DL3059
RUN pip install --no-cache-dir -r /tmp/vllm.txt

# flash-attn, optional: neither vLLM (it ships its own FlashAttention kernels) nor rl_core (it
# trains with PyTorch's SDPA attention) needs it; model code that imports it does. PyPI has no
# wheel of it for torch 2.13, so it compiles here against the installed torch, every installed
# version held (needs the devel flavour; MAX_JOBS bounds the compilers running at once, and with
# them the memory the build takes).
ARG INSTALL_FLASH_ATTN=0
ARG FLASH_ATTN_VERSION=2.8.3.post2
ARG MAX_JOBS=4
RUN if [ "$INSTALL_FLASH_ATTN" = 1 ]; then \
        command -v nvcc >/dev/null \
            || { echo "INSTALL_FLASH_ATTN=1 compiles CUDA code: needs CUDA_FLAVOR=devel" >&2; \
                 exit 1; }; \
        pip freeze > /tmp/installed.txt \
     && MAX_JOBS="$MAX_JOBS" pip install --no-cache-dir --no-build-isolation \
            -c /tmp/installed.txt "flash-attn==$FLASH_ATTN_VERSION"; \
    fi

# The project itself, its dependencies all in place (--no-deps re-resolves none of them).
COPY rl_core rl_core
COPY workers workers
RUN pip install --no-cache-dir --no-deps -e '.[vllm,cuda,megatron]' && pip check

COPY . .
CMD ["bash", "deploy/smoke.sh"]
