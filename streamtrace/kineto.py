"""Trace-format facts every layer shares (SPEC 2).

Kept apart so that the pure algorithms, the reader and the commands agree on
what a GPU slice or a runtime call is without importing one another.
"""
from __future__ import annotations

from decimal import Decimal

NUMBER_TYPES = frozenset({float, int, Decimal})
"""The types a JSON number is read as, in fast and in exact mode."""

GPU_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "gpu_memset"})
"""Measured GPU slices: what ``compact`` moves and ``attribute`` lists."""
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
"""CPU-side calls that carry the correlation id of the GPU work they launch."""
