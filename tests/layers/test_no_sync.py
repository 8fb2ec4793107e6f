"""The layers' finite checks never force a host synchronisation or a ``torch.compile`` graph
break (issue: a CEM training step synchronised the GPU once per layer and split its compiled
graph, which Llama's layers did not).

Policy (:func:`cemlib.utils.finite_check_is_free`): ``check_finite`` rejects NaN/Inf input with a
clear error on CPU tensors in eager mode, where the check is free (tested with each layer); on
any other device and under ``torch.compile`` the layer does not look at the values, and the
trainer's per-step loss and gradient-norm check catches NaN/Inf. Checked here without a GPU:

- on the ``meta`` device (shapes, no data) a layer that read a value on the host would fail;
- ``torch.compile(fullgraph=True)`` of a whole language model (CEM, T = 2, and Llama) raises at
  the first graph break; ``torch._dynamo``'s counters confirm there are none;
- on CUDA (skipped here) ``torch.cuda.set_sync_debug_mode("error")`` turns any synchronising
  call of a CEM layer's forward and backward into an error.
"""

import pytest
import torch

from cemlib.kernels import dispatch
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.utils import finite_check_is_free


def _layers(device):
    torch.manual_seed(0)
    return [CEMAttention(16, 2, T=2, check_finite=True).to(device),
            CEMMLP(16, 40, T=2, check_finite=True).to(device)]


def test_finite_check_is_free_on_cpu_in_eager_mode_only():
    assert finite_check_is_free(torch.zeros(3))
    assert not finite_check_is_free(torch.zeros(3, device="meta"))
    results = []

    def probe(x):
        results.append(finite_check_is_free(x))  # evaluated while dynamo traces
        return x + 1

    torch._dynamo.reset()
    torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(3))
    assert results == [False]


@pytest.mark.parametrize("index", [0, 1], ids=["attention", "mlp"])
def test_layers_do_not_read_values_off_the_cpu(index):
    """On the meta device any host read of a value (``bool``, ``.item()``) raises."""
    layer = _layers("meta")[index]
    x = torch.empty(2, 7, 16, device="meta", requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape


@pytest.mark.parametrize("index", [0, 1], ids=["attention", "mlp"])
def test_layers_keep_the_clear_error_on_cpu(index):
    layer = _layers("cpu")[index]
    with pytest.raises(ValueError, match="NaN/Inf"):
        layer(torch.full((2, 7, 16), float("nan")))


@pytest.mark.parametrize("arch", ["cem", "llama"])
def test_compiled_training_step_has_no_graph_break(arch):
    """Attention through the reference (what runs on a GPU in fp32; in bf16 the kernels, single
    custom-op nodes): the CPU closed form's own guard against an underflowing diagonal
    probability reads a value (free on the CPU, where it runs eagerly)."""
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=17, context_length=12, d_model=16, n_layers=1, n_heads=2, attn=arch,
                   mlp=arch, T_attn=2 if arch == "cem" else 1, T_mlp=2 if arch == "cem" else 1,
                   check_finite=True)
    model = LanguageModel(cfg)
    idx = torch.randint(0, 17, (2, 12))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with dispatch.use_backend("reference"):
        compiled(idx).square().mean().backward()
    assert sum(counters["graph_break"].values()) == 0
    assert all(p.grad is not None for p in model.parameters())


def _token_model(arch):
    from cemlib.models.nrgpt import (AUTHORS_BASELINE, AUTHORS_NRGPT, GPTModel, NRGPTModel,
                                     RecurrentGPTModel)
    torch.manual_seed(0)
    if arch == "hyperset":
        from cemlib.models.hyperset import HyperSETModel
        return HyperSETModel(d=16, n_heads=2, n_iter=2, n_classes=5, n_positions=12,
                             vocab_size=17)
    if arch == "nrgpt":
        return NRGPTModel(17, 12, 16, n_heads=2, n_steps=2, mask="inclusive", **AUTHORS_NRGPT)
    if arch == "rgpt":
        return RecurrentGPTModel(17, 12, 16, n_heads=2, n_steps=2, **AUTHORS_BASELINE)
    return GPTModel(17, 12, 16, n_heads=2, n_layers=2, **AUTHORS_BASELINE)


@pytest.mark.parametrize("arch", ["nrgpt", "rgpt", "gpt", "hyperset"])
def test_compiled_token_models_have_no_graph_break(arch):
    """The NRGPT family (NRGPT with the authors' options, its recurrent and plain GPT baselines),
    which the GPU presets compile, and Hyper-SET: no value is read while dynamo traces. Failing
    input: the token-id range checks and the layers' and energies' finite checks as they were
    (``bool`` of a tensor at every call: 5 breaks in the GPT, 11 to 14 in NRGPT, 9 in a
    Hyper-SET model; on a GPU in eager mode each also a host synchronisation)."""
    from torch._dynamo.utils import counters
    model = _token_model(arch)
    idx = torch.randint(0, 17, (2, 12))
    torch._dynamo.reset()
    counters.clear()
    torch.compile(model, backend="eager", fullgraph=True)(idx).square().mean().backward()
    assert sum(counters["graph_break"].values()) == 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", ["nrgpt", "gpt"])
def test_token_models_do_not_read_values_off_the_cpu(arch):
    """The body (every layer and energy, applied at each step) on the meta device, where a host
    read of a value raises (the token-id range check before it reads values, once per call in
    eager mode, as the CEM and Llama models do); on the CPU in eager mode the clear errors stay
    (NaN/Inf in an energy's input)."""
    model = _token_model(arch).to("meta")
    x = torch.empty(2, 12, 16, device="meta", requires_grad=True)
    model._body(x).sum().backward()
    assert x.grad.shape == x.shape
    from cemlib.energies import nrgpt as energies
    g = torch.full((1, 3, 4), float("nan"))
    with pytest.raises(ValueError, match="NaN/Inf"):
        energies.attention_energy(g, torch.randn(1, 4, 4), torch.ones(1), 1.0)


def test_where_free_finite_check_is_checked():
    from cemlib.utils import check_tensor
    nan = torch.full((2,), float("nan"))
    with pytest.raises(ValueError, match="NaN/Inf"):
        check_tensor(nan, "x", finite="where_free")  # CPU, eager: free, so checked
    check_tensor(torch.empty(2, device="meta"), "x", finite="where_free")  # not free: skipped
    with pytest.raises(ValueError, match="finite must be"):
        check_tensor(nan, "x", finite="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("index", [0, 1], ids=["attention", "mlp"])
def test_layers_do_not_synchronise_cuda(index):
    layer = _layers("cuda")[index]
    x = torch.randn(2, 64, 16, device="cuda", requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                y = layer(x)
            y.float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
