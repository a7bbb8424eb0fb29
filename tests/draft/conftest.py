import pytest

from tests.torch_threads import one_torch_thread


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # Two shared cores: intra-op threads only add contention for these tiny tensors (measured 3-10x slower);
    # the train_cli and torchrun subprocesses get one thread too (tests/torch_threads.py).
    with one_torch_thread():
        yield
