"""Units of the plan's arithmetic: bytes per GiB and per element of each precision."""
from __future__ import annotations

GIB = 1024 ** 3
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
