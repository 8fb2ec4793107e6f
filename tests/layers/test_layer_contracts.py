"""What each public layer's ``forward`` returns, checked on the layer itself, and that every energy
layer and energy function cites the equation it implements.

A *stream* layer (CEM attention, the CEM MLP, NRGPT's block, Hyper-SET's steps, ...) returns
input + update, so it is used as ``x = layer(x)``; with its weights set to zero (or a zero step) it
returns its input unchanged. A *branch* layer (Llama attention, SwiGLU, GPT's sublayers) returns
the update only (``x = x + layer(norm(x))``) and returns zero. A step on a free energy returns the
stepped state. Using a stream layer as a branch trains a different model, which the CEM MLP test
shows.
"""

import inspect
import re
from pathlib import Path

import pytest
import torch

import cemlib.layers as L
import cemlib.models as M
from cemlib.layers import hyperset_variants as hv
from cemlib.layers.reuse import IncrementDropout

D = 8


_CITES = re.compile(r"\beqs?\.|equation|Algorithm|Table|§|Appendix|App\.|:cite:|Definition|Prop|Theorem|Lemma", re.I)


def _energy_layers():
    return [getattr(L, n) for n in L.__all__ if inspect.isclass(getattr(L, n)) and getattr(L, n) is not L.EnergyLayer
            and callable(getattr(getattr(L, n), "energy", None))]


def _energy_functions():
    import importlib
    import pkgutil

    import cemlib.energies as E
    out = []
    for info in pkgutil.iter_modules(E.__path__):
        mod = importlib.import_module(f"cemlib.energies.{info.name}")
        out += [getattr(mod, n) for n in getattr(mod, "__all__", []) if n.endswith("energy")
                and inspect.isfunction(getattr(mod, n))]
    return out


@pytest.mark.parametrize("obj", _energy_layers() + _energy_functions(), ids=lambda o: o.__qualname__)
def test_every_energy_cites_the_equation_it_implements(obj):
    assert _CITES.search(inspect.getdoc(obj) or ""), f"{obj.__module__}.{obj.__qualname__}: cite its equation"


def _zero(module):
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    return module


def _swiglu_sublayer():
    return L.ResidualSublayer(L.SwiGLU(D, 16), D)


#: stream -> stream layers: forward returns input + update (use ``x = layer(x)``)
STREAM = {
    "CEMAttention": lambda: L.CEMAttention(D, 2), "CEMMLP": lambda: L.CEMMLP(D, 16),
    "NRGPTBlock": lambda: L.NRGPTBlock(D, 2), "SubspaceAttention": lambda: L.SubspaceAttention(D, 2),
    "TiedFeedForward": lambda: L.TiedFeedForward(D, 16), "BiSoftmaxAttention": lambda: L.BiSoftmaxAttention(D, 2),
    "SigmoidAttention": lambda: hv.SigmoidAttention(D, 2), "LinearAttention": lambda: hv.LinearAttention(D, 2),
    "TiedReLUFeedForward": lambda: L.TiedReLUFeedForward(D, 16),
    "SoftmaxFeedForward": lambda: hv.SoftmaxFeedForward(D, 16),
    "GatedFeedForward": lambda: hv.GatedFeedForward(D, 16),
    "ResidualSublayer": _swiglu_sublayer, "LayerReuse": lambda: L.LayerReuse(_swiglu_sublayer(), 2),
    "IncrementDropout": lambda: IncrementDropout(L.CEMMLP(D, 16), 0.5),
    "Block": lambda: L.Block(L.CEMAttention(D, 2), L.CEMMLP(D, 16)), "CEMBlock": lambda: L.CEMBlock(D, 2, 16),
    "LlamaBlock": lambda: L.LlamaBlock(D, 2, 16), "GPTBlock": lambda: L.GPTBlock(D, 2),
    "ParallelGPTBlock": lambda: L.ParallelGPTBlock(D, 2), "RecurrentGPT": lambda: L.RecurrentGPT(D, 2, 2),
    "HyperSETLayer": lambda: L.HyperSETLayer(L.BiSoftmaxAttention(D, 2), L.TiedReLUFeedForward(D, 16), 1.0),
}
#: steps on a free energy: forward(z, h) returns the stepped state z' (a zero step returns z)
STEPS = {
    "SoftmaxAttentionStep": lambda: L.SoftmaxAttentionStep(D), "LinearAttentionStep": lambda: L.LinearAttentionStep(D),
    "MeanShiftAttentionStep": lambda: L.MeanShiftAttentionStep(D, eta=0.0), "Att2nd": lambda: L.Att2nd(D, eta=0.0),
    "Att2nd1st": lambda: L.Att2nd1st(D, eta=0.0), "MHA2nd": lambda: L.MHA2nd(D, 2, eta=0.0),
    "MHA2nd1st": lambda: L.MHA2nd1st(D, 2),
}
#: branches: forward returns the update only (use ``x = x + layer(norm(x))``)
BRANCH = {"LlamaAttention": lambda: L.LlamaAttention(D, 2), "SwiGLU": lambda: L.SwiGLU(D, 16),
          "CausalSelfAttention": lambda: L.CausalSelfAttention(D, 2), "MLP": lambda: L.MLP(D)}
#: not sublayers of a block
HELPERS = {"EnergyLayer", "RMSNorm", "Preconditioner", "StepSizeNet", "DepthwiseLoRA"}


def test_every_public_layer_is_classified():
    names = {n for n in L.__all__ if inspect.isclass(getattr(L, n))}
    assert names - HELPERS <= set(STREAM) | set(STEPS) | set(BRANCH), names - HELPERS - set(STREAM) - set(STEPS) - set(BRANCH)


@pytest.mark.parametrize("name", sorted(STREAM))
def test_stream_layers_return_input_plus_update(name):
    layer = _zero(STREAM[name]()).double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_free_energy_steps_return_the_stepped_state(name):
    layer = _zero(STEPS[name]()).double() if name != "MHA2nd" else STEPS[name]().double()
    z = torch.randn(2, 5, D, dtype=torch.float64)
    torch.testing.assert_close(layer(z, z.unsqueeze(-3)), z, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(BRANCH))
def test_branch_layers_return_the_update_only(name):
    layer = _zero(BRANCH[name]()).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert torch.count_nonzero(layer(x)) == 0


def test_cem_mlp_is_the_pre_norm_tied_gated_mlp_its_docstring_writes(float64):
    mlp = L.CEMMLP(D, 16)
    with torch.no_grad():
        mlp.norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, D)
    hn = mlp.norm(x)
    expected = x + (hn @ mlp.W.T * torch.nn.functional.silu(hn @ mlp.V.T)) @ mlp.V
    torch.testing.assert_close(mlp(x), expected)  # the docstring's x + V^T (W RMSNorm(x) * SiLU(V RMSNorm(x)))
    assert (mlp(x) - (x + mlp(mlp.norm(x)))).abs().max() > 0.1  # the wrong usage is a different model


def test_the_api_reference_page_documents_every_public_layer_and_model():
    page = (Path(__file__).resolve().parents[2] / "book" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. auto(?:class|function|exception):: ([\w.]+)", page, re.M))
    short = {name.rsplit(".", 1)[1] for name in documented}
    public = {n for mod in (L, M) for n in mod.__all__ if inspect.isclass(getattr(mod, n))}
    assert public <= short, f"not on book/api.md: {sorted(public - short)}"
    toc = (Path(__file__).resolve().parents[2] / "_toc.yml").read_text()
    assert "- file: book/api" in toc
