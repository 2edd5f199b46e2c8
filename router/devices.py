"""Device rooflines for the cost model: a re-export of the one table in `kernels.devices`.

`kernels.devices` is pure Python (no torch), so router stays light. Only lookup_device is
wrapped, to raise the router's own error.
"""

from __future__ import annotations

from kernels.devices import DEVICES, DeviceSpec, detect_cpu
from kernels.devices import lookup_device as _lookup
from kernels.errors import UnknownDevice
from router.errors import RouterError

__all__ = ["DEVICES", "DeviceSpec", "detect_cpu", "lookup_device"]


def lookup_device(name: str) -> DeviceSpec:
    try:
        return _lookup(name)
    except UnknownDevice as e:
        raise RouterError(str(e)) from None
