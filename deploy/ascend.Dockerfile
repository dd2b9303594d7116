# syntax=docker/dockerfile:1
# The Ascend image of Ascent: the training environment of an Ascend NPU node (a Ray worker of an
# Ascend cluster), with vllm-ascend for `rollout.engine: vllm`. Its default command is the smoke
# run (deploy/smoke.sh on npu); docs/images.md has the rest, the `docker run` flags included.
#   docker build -f deploy/ascend.Dockerfile -t ascent:ascend .
#   docker build -f deploy/ascend.Dockerfile \
#       --build-arg VLLM_ASCEND_IMAGE=quay.io/ascend/vllm-ascend:v0.26.0rc1-a3 -t ascent:ascend-a3 .
#
# One matched set, as vllm-ascend documents it for its v0.26.0rc1 release (the installation guide,
# https://docs.vllm.ai/projects/ascend/en/v0.26.0rc1/installation.html, and the release's
# requirements.txt and Dockerfile): vllm-ascend 0.26.0rc1, vLLM 0.26.0, CANN 9.1.0, torch 2.10.0,
# torch_npu 2.10.0.post4, triton-ascend 3.2.2, on the CANN image's Python 3.12. The base is
# vllm-ascend's own image of that release, which holds exactly that set, its custom kernels built
# for Atlas A2 (the `-a3` tag is the Atlas A3 build).
# Not v0.23.0, the newest row of vllm-ascend's release compatibility matrix
# (https://docs.vllm.ai/projects/ascend/en/latest/community/versioning_policy.html; same CANN,
# torch and torch_npu) and the newest vllm-ascend on PyPI: its NPU worker has no
# `reload_weights`, the call through which rl_core streams the trainer's weights into vLLM after
# every update; the worker has it from v0.24.0rc1 on.
ARG VLLM_ASCEND_IMAGE=quay.io/ascend/vllm-ascend:v0.26.0rc1
FROM ${VLLM_ASCEND_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# vllm-ascend's image points pip at a mirror of its own choosing; the project installs from this
# index (any PyPI mirror will do).
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHON=python3 SMOKE_DEVICE=npu
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./

# torch stays the image's 2.10.0, the version torch_npu 2.10.0.post4 and CANN 9.1.0 are built for,
# although the project pins torch==2.13.0 (the CPU and CUDA builds): every package in the image
# becomes a constraint at its installed version, the project's dependencies but torch are
# installed against them, and then the project itself without re-resolving any (--no-deps; the
# `ascend` extra's torch-npu, and vllm-ascend, are the image's).
RUN python3 - <<'EOF'
import re
import tomllib
from importlib.metadata import distributions


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def name_of(requirement):
    return norm(re.split(r"[=<>!~;\s\[]", requirement.strip(), maxsplit=1)[0])


installed = {}
for dist in distributions():
    if dist.metadata["Name"]:
        installed.setdefault(norm(dist.metadata["Name"]), dist.version)
with open("/tmp/stack-pins.txt", "w") as out:
    out.writelines(f"{name}=={version}\n" for name, version in sorted(installed.items()))
with open("constraints.txt") as pins, open("/tmp/project-pins.txt", "w") as out:
    out.writelines(line for line in pins if line.strip() and not line.startswith("#")
                   and name_of(line) not in installed)
with open("pyproject.toml", "rb") as project:
    dependencies = tomllib.load(project)["project"]["dependencies"]
with open("/tmp/project-deps.txt", "w") as out:
    out.writelines(f"{dep}\n" for dep in dependencies if name_of(dep) != "torch")
EOF

# constraints.txt was resolved for the CPU environment (torch 2.13, Ray 2.60); where one of its pins
# cannot stand beside vllm-ascend's packages, pip resolves those dependencies against the image
# alone, and says so in the build log.
RUN python3 -m pip install --no-cache-dir -c /tmp/stack-pins.txt -c /tmp/project-pins.txt \
        -r /tmp/project-deps.txt \
 || { echo "ascent: constraints.txt does not fit beside the image's packages; resolving the" \
           "project's dependencies against the image alone" >&2 \
      && python3 -m pip install --no-cache-dir -c /tmp/stack-pins.txt -r /tmp/project-deps.txt; }

COPY rl_core rl_core
COPY workers workers
RUN python3 -m pip install --no-cache-dir --no-deps -e '.[ascend]'

COPY . .
# CANN's libraries and tools come from its environment scripts, which the image's interactive
# shells read from ~/.bashrc; this entrypoint reads them for every command.
COPY --chmod=755 <<'EOF' /usr/local/bin/ascent-entrypoint
#!/bin/bash
for script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh; do
    if [ -f "$script" ]; then . "$script"; fi
done
exec "$@"
EOF

ENTRYPOINT ["/usr/local/bin/ascent-entrypoint"]
CMD ["bash", "deploy/smoke.sh"]
