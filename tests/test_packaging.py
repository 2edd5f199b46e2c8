"""The package metadata: an SPDX license expression, and no deprecation warnings from ours."""

from __future__ import annotations

import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_pyproject_applies_without_warnings_and_has_an_spdx_license() -> None:
    # What `pip install` runs: setuptools reads [project] into the distribution's metadata.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning fails the test
        dist = apply_configuration(Distribution(), PYPROJECT)
    assert dist.metadata.license_expression == "Apache-2.0"
    assert "schemathesis" in " ".join(dist.extras_require["test"])
