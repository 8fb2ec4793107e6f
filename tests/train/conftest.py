"""The training engine's tests train tiny models: one torch thread each, restored afterwards (a tiny
model trains faster on one thread, and on a CPU shared with other work several threads each wait
for the others; the runs the tests compare are made with the same count)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
