"""python -m transformer_engine.pytorch.attention.dot_product_attention.exact_fp8.audit"""

import sys

from .cli import main

sys.exit(main())
