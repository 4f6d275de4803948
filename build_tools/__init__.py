"""Build tooling of the mask-exact FP8 attention fork of Transformer Engine.

Upstream Transformer Engine is never vendored: it is fetched from its pinned PyPI artifacts
(`pinned`, `fetch`), patched with the series in `patches/` (`patching`) and completed with the
files this repository adds (`assemble`). See docs/building.md.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
