"""Suite-wide rules.

- Tests marked `kernel` need root, runc and busybox-static; elsewhere they skip,
  saying why. Under CI they may not skip: the run fails instead.
"""

from __future__ import annotations

import os

import pytest

from tests.support.runc import missing_requirements

pytest_plugins = ["tests.support.fixtures"]
WHY_NOT = missing_requirements()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kernel = [item for item in items if item.get_closest_marker("kernel")]
    if not WHY_NOT or not kernel:
        return
    if os.environ.get("CI"):
        raise pytest.UsageError(
            f"CI is set but {len(kernel)} kernel tests cannot run ({WHY_NOT}); "
            "CI runs as root with runc: fix the machine's setup, not the tests"
        )
    for item in kernel:
        item.add_marker(pytest.mark.skip(reason=f"kernel test: {WHY_NOT}"))
