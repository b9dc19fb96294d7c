"""oneDNN-packed matmuls: same results as F.linear, and never in the way of autograd, other dtypes or updates."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gumiho.packed import PackedLinear, PackedMatrix, pack_linears, packing_enabled

pytestmark = pytest.mark.skipif(not packing_enabled(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (1, 1, 48), (2, 7, 48)])
def test_matches_linear(shape):
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(*shape)
    with torch.inference_mode():
        got = PackedMatrix(weight, bias)(x)
    assert got.shape == (*shape[:-1], 96)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_packs_once_and_repacks_after_an_in_place_update():
    torch.manual_seed(0)
    weight, x = torch.randn(32, 16), torch.randn(3, 16)
    matrix = PackedMatrix(weight)
    with torch.no_grad():
        matrix(x)
        first = matrix._packed
        matrix(x)
        assert matrix._packed is first
        weight.mul_(2)  # what an optimizer step does
        got = matrix(x)
    assert matrix._packed is not first
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-5, atol=1e-5)


def test_autograd_and_other_dtypes_use_plain_linear(monkeypatch):
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    packed = PackedLinear.wrap(linear)
    x = torch.randn(4, 16)
    out = packed(x)  # grad enabled and the weight requires grad: must be differentiable
    out.sum().backward()
    assert linear.weight.grad is not None and packed.__dict__["_matrix"]._packed is None
    with torch.inference_mode():
        half = PackedMatrix(linear.weight.detach().to(torch.float64))(x.double())
    assert half.dtype == torch.float64
    monkeypatch.setenv("GUMIHO_PACKED", "0")
    matrix = PackedMatrix(linear.weight.detach())
    with torch.inference_mode():
        matrix(x)
    assert matrix._packed is None


def test_pack_linears_keeps_parameters_and_state_dict():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 8)
    expected = model(x)
    assert pack_linears(model) == 2
    assert pack_linears(model) == 0  # already packed
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    assert model.state_dict().keys() == before.keys()
    with torch.inference_mode():
        torch.testing.assert_close(model(x), expected.detach(), rtol=1e-5, atol=1e-5)


def test_bf16_matches_linear_up_to_bf16_rounding():
    """Packed where oneDNN's bf16 path runs; F.linear on a CPU without it (AVX2 only): the same result either way."""
    torch.manual_seed(0)
    weight, bias, x = (t.bfloat16() for t in (torch.randn(96, 48), torch.randn(96), torch.randn(3, 48)))
    with torch.inference_mode():
        got = PackedMatrix(weight, bias)(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, weight, bias).float(), rtol=2e-2, atol=2e-2)


def test_autocast_picks_the_dtype_of_a_packed_matrix():
    """Self-distillation runs the lean forward under bf16 autocast on CPUs with bf16 units: the packed fp32 weight
    must then give way to F.linear, which autocast runs in bf16."""
    weight, x = torch.randn(64, 32), torch.randn(5, 32)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = PackedMatrix(weight)(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), x @ weight.T, rtol=2e-2, atol=5e-2)
