import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # Two shared cores: intra-op threads only add contention for these tiny tensors (measured 3-10x slower).
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
