"""Activation memory saved for backward (cemlib.models.memory), used by the CEM Transformer chapter."""

import pytest
import torch

from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.memory import lm_saved_activation_bytes, saved_activation_bytes


def test_matmul_saves_only_the_input_when_the_weight_is_excluded():
    x = torch.randn(5, 7)
    W = torch.nn.Parameter(torch.randn(7, 3))
    assert saved_activation_bytes(lambda: (x @ W).sum(), exclude=[W]) == x.nbytes
    xg = torch.randn(5, 7, requires_grad=True)          # grad for x too: the weight is saved as well
    assert saved_activation_bytes(lambda: (xg @ W).sum()) == xg.nbytes + W.nbytes
    assert saved_activation_bytes(lambda: (xg @ W).sum(), exclude=[W]) == xg.nbytes
    # tanh saves its output (5 x 3 float32) on top of the matmul's input
    assert saved_activation_bytes(lambda: torch.tanh(x @ W).sum(), exclude=[W]) == x.nbytes + 5 * 3 * 4


def test_each_storage_counted_once_and_nothing_without_grad():
    x = torch.randn(4, 6, requires_grad=True)
    assert saved_activation_bytes(lambda: (x * x).sum()) == x.nbytes          # saved twice, one storage
    assert saved_activation_bytes(lambda: (x[:2] * x[2:]).sum()) == x.nbytes  # two views, one storage
    with torch.no_grad():
        assert saved_activation_bytes(lambda: (x * x).sum()) == 0
    assert saved_activation_bytes(lambda: (torch.randn(3) * 2).sum()) == 0    # nothing needs grad
    with pytest.raises(TypeError):
        saved_activation_bytes(3)


def test_lm_bytes_deterministic_grow_with_batch_and_recursion():
    torch.manual_seed(0)
    base = dict(vocab_size=11, context_length=8, d_model=16, n_layers=1, n_heads=2)
    idx = torch.randint(0, 11, (2, 8))
    models = {T: LanguageModel(LMConfig(**base, attn="cem", mlp="cem", T_attn=T, T_mlp=T)) for T in (1, 2)}
    b1 = lm_saved_activation_bytes(models[1], idx, idx)
    assert b1 > 0 and b1 == lm_saved_activation_bytes(models[1], idx, idx)
    assert lm_saved_activation_bytes(models[1], idx[:1], idx[:1]) < b1
    assert lm_saved_activation_bytes(models[2], idx, idx) > b1   # every recursion step keeps its activations
    with pytest.raises(ValueError):
        lm_saved_activation_bytes(models[1], idx, idx[:, :4])
