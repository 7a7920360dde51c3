"""Fixtures of the trainer tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def deterministic_float32():
    """Full float32 matmuls and a fixed seed in every test, restored afterwards."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    yield
    torch.set_float32_matmul_precision(previous)
