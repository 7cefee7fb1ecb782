"""``python -m benchmarks.gpu_check OUT_DIR ...`` from the repository root; on a GPU node
benchmarks/gpu_check/gpu_check.sh, which picks the interpreter, is the entry."""

import sys

from ._driver import main

sys.exit(main())
