import matplotlib
import pytest
import torch

from cemlib.layers.norm import RMSNorm, layer_norm, layer_norm_vjp, rms_norm, rms_norm_vjp
from cemlib.testing import assert_grad_matches_autograd
from cemlib.utils import check_positive_int, check_tensor, default_device, seed_everything



pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("gain", [False, True])
def test_norm_vjps_match_autograd(gain):
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    w = torch.randn(9, generator=g) if gain else None
    assert_grad_matches_autograd(lambda z: (rms_norm(z, w) * v).sum(-1),
                                 lambda z: rms_norm_vjp(z, v, w), x)
    assert_grad_matches_autograd(lambda z: (layer_norm(z, w) * v).sum(-1),
                                 lambda z: layer_norm_vjp(z, v, w), x)


def test_rmsnorm_module_and_radial_direction():
    m = RMSNorm(6, eps=0.0)
    with torch.no_grad():
        m.weight.uniform_(0.5, 2.0)
    x = torch.randn(3, 6)
    torch.testing.assert_close(m(x), rms_norm(x, m.weight, eps=0.0))
    # With eps = 0 RMSNorm is scale invariant, so J^T v vanishes when gain * v is radial (along x).
    torch.testing.assert_close(m.vjp(x, x / m.weight), torch.zeros_like(x), atol=1e-12, rtol=0)


def test_layer_norm_matches_torch():
    x = torch.randn(5, 7)
    torch.testing.assert_close(layer_norm(x), torch.nn.functional.layer_norm(x, (7,)))


def test_seed_and_device_and_checks(monkeypatch):
    seed_everything(3)
    a = torch.rand(3)
    seed_everything(3)
    assert torch.equal(a, torch.rand(3))
    with pytest.raises(ValueError, match="seed"):
        seed_everything(-1)
    monkeypatch.setenv("CEMLIB_DEVICE", "cpu")
    assert default_device().type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda"):
            default_device("cuda")
    with pytest.raises(ValueError, match=r"h must have 3 dimensions, got shape \(2, 3\)"):
        check_tensor(torch.zeros(2, 3), "h", ndim=3)
    with pytest.raises(ValueError, match="last dimension 4"):
        check_tensor(torch.zeros(2, 3), "h", last_dim=4)
    with pytest.raises(ValueError, match="NaN"):
        check_tensor(torch.tensor([1.0, float("nan")]), "x")
    with pytest.raises(ValueError, match="T must be a positive integer, got 0"):
        check_positive_int(0, "T")


def test_book_style_is_opaque_white():
    import matplotlib.pyplot as plt

    from cemlib.viz import use_book_style

    use_book_style()
    for key in ("figure.facecolor", "savefig.facecolor", "axes.facecolor"):
        assert matplotlib.colors.to_hex(matplotlib.rcParams[key]) == "#ffffff"
    assert matplotlib.rcParams["savefig.transparent"] is False
    plt.close("all")
