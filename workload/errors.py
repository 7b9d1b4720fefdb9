"""Errors the workload reports as a JSON ``error`` line instead of a traceback.

Every error here is a *handled* error: the message says what went wrong and what to do.
Anything else raised during a run is a bug and keeps its traceback (on stderr).
"""

from __future__ import annotations


class WorkloadError(Exception):
    """Root of the handled errors; ``kind`` is a short machine-readable category."""

    kind = "error"
    exit_code = 2


class ConfigError(WorkloadError):
    """A bad command line or an impossible combination of options."""

    kind = "config"


class ArchError(WorkloadError):
    """The requested architecture is not a torchvision classification model."""

    kind = "arch"


class WeightsError(WorkloadError):
    """Pretrained weights were requested but are not in the checkpoint directory."""

    kind = "weights"


class DataError(WorkloadError):
    """The dataset path is missing, empty or not an ImageFolder tree of JPEGs."""

    kind = "data"


class DeviceError(WorkloadError):
    """The requested device is not available in this environment."""

    kind = "device"


class OutOfMemory(WorkloadError):
    """The accelerator ran out of memory for this configuration."""

    kind = "oom"
    exit_code = 3
