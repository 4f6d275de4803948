"""Fixtures of the build tests: the pinned pure-Python upstream wheel, fetched and unpacked once.

The wheel (1.2 MB) comes from NVTE_FORK_ARTIFACTS_DIR when set, else from the artifact cache,
downloaded from PyPI on first use. Nothing here needs TE's core library, a GPU or nvcc.
"""

import shutil

import pytest

from build_tools import assemble, fetch, pinned


@pytest.fixture(scope="session")
def pure_wheel():
    return fetch.fetch(pinned.PURE_PYTHON_WHEEL)


@pytest.fixture(scope="session")
def upstream_tree(pure_wheel, tmp_path_factory):
    """A folder holding the unpacked, unpatched upstream `transformer_engine/` (read-only use)."""
    root = tmp_path_factory.mktemp("upstream")
    assemble.unpack_package(pure_wheel, root)
    return root


@pytest.fixture
def tree(upstream_tree, tmp_path):
    """A private, writable copy of the upstream tree."""
    shutil.copytree(upstream_tree / pinned.PACKAGE, tmp_path / pinned.PACKAGE)
    return tmp_path
