import pytest
import torch


def gpu_available() -> bool:
    return torch.cuda.is_available()


requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")
