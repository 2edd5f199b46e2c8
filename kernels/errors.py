class KernelError(Exception):
    """Base error of the kernels package."""


class InvalidSamplingParams(KernelError):
    """A sampling parameter is out of range (temperature < 0, top_p outside (0, 1], ...)."""


class ShapeMismatch(KernelError):
    """Hidden states and the weight rows disagree on d, or the group sizes disagree."""


class UnknownDevice(KernelError):
    """No roofline entry for the named device."""


class CalibrationError(KernelError):
    """A calibration file is unreadable or a sweep could not run."""
