"""Make the repository's `transformer_engine` tree importable without installing the fork.

Without upstream TE installed, `transformer_engine` resolves to this repo's namespace tree, which
holds only the files the fork adds; with the fork installed, the installed package wins.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
