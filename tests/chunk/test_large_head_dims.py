"""Head dims past one 128-wide tile (the intra loops run over several K tiles) and not
powers of two: forward, decode and a gradient, against the float64 reference."""
import torch

from cases import make_inputs

import kdagen
from kdagen.spec.reference import naive_recurrent_kda

import pytest
pytestmark = pytest.mark.slow  # subprocesses, compiles or long interpreter runs


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def test_k200_v256_forward_decode_and_gradient():
    x = make_inputs(1, 37, 1, 1, 200, 256, seed=0)
    q, k, v, g, beta, h0 = x.q, x.k, x.v, x.g, x.beta, x.h0
    ro, rs = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = kdagen.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                            safe_gate=True, lower_bound=-5.0)
    assert _rel(o, ro) < 1e-5 and _rel(s, rs) < 1e-5
    o, s = kdagen.fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert _rel(o, ro) < 1e-5 and _rel(s, rs) < 1e-5
    qr = q.clone().requires_grad_()
    o, s = kdagen.chunk_kda(qr, k, v, g, beta, initial_state=h0, output_final_state=True,
                            safe_gate=True, lower_bound=-5.0)
    (o.sum() + s.square().sum()).backward()
    qd = q.double().clone().requires_grad_()
    ro, rs = naive_recurrent_kda(qd, k, v, g, beta, initial_state=h0, output_final_state=True)
    (ro.sum() + rs.square().sum()).backward()
    assert _rel(qr.grad, qd.grad) < 1e-5
