"""Install the mask-exact FP8 attention fork of Transformer Engine 2.20.2.

    pip install --no-build-isolation .

The distribution is `transformer-engine` 2.20.2: upstream's pure-Python package with the patches
of patches/ and this repository's new files, plus the `transformer_engine_exact_fp8` extension.
It requires upstream's core library and PyTorch extension of the same version. docs/building.md
has the details (offline installs, environment variables).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from setuptools import setup  # noqa: E402

from build_tools import commands, pinned  # noqa: E402

DESCRIPTION = "Transformer Engine with mask-exact FP8 dot-product attention"
README = ROOT / "README.md"
EGG_BASE = ROOT / "build"  # keep setuptools' egg-info out of the repository root
EGG_BASE.mkdir(exist_ok=True)
AUDIT = "transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit.cli:main"

setup(
    name="transformer-engine",
    version=pinned.UPSTREAM_VERSION,  # upstream's runtime check wants core == torch lib == this
    description=DESCRIPTION,
    long_description=README.read_text() if README.is_file() else DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=[],  # the package tree is assembled by build_tools.commands.BuildPy
    ext_modules=[commands.extension()],
    install_requires=commands.install_requires(),
    entry_points={"console_scripts": [f"te-fp8-causality-audit = {AUDIT}"]},
    cmdclass=commands.CMDCLASS,
    zip_safe=False,
    options={"egg_info": {"egg_base": str(EGG_BASE)}},
)
