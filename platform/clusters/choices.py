"""Enumerations of the clusters app."""

from django.db import models


class DeviceKind(models.TextChoices):
    """What a run asks for; matches rl_core.spec DEVICE_TYPES and Ray's resource names."""

    NPU = "npu", "Ascend NPU"
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU"


class DeviceType(models.TextChoices):
    """The device model installed in a node."""

    ASCEND_910B = "ascend-910b", "Ascend 910B"
    ASCEND_910C = "ascend-910c", "Ascend 910C"
    ASCEND_310P = "ascend-310p", "Ascend 310P"
    NVIDIA_A100 = "nvidia-a100", "NVIDIA A100"
    NVIDIA_H100 = "nvidia-h100", "NVIDIA H100"
    NVIDIA_H200 = "nvidia-h200", "NVIDIA H200"
    NVIDIA_OTHER = "nvidia-other", "NVIDIA (other)"
    CPU = "cpu", "CPU only"


def kind_of(device_type: str) -> DeviceKind:
    """The kind of device a node's device model provides."""
    if device_type.startswith("ascend-"):
        return DeviceKind.NPU
    if device_type.startswith("nvidia-"):
        return DeviceKind.GPU
    return DeviceKind.CPU


class ClusterStatus(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    ONLINE = "online", "Online"
    DEGRADED = "degraded", "Degraded"
    OFFLINE = "offline", "Offline"


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    DOWN = "down", "Down"
