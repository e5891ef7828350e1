"""A KDA layer trained with kdagen.chunk_kda as FLA's drop-in: the gate, the q/k l2-norm and
the beta sigmoid computed in the kernels, gradients through the generated backward.  One
step's parameter gradients are checked against the same layer run on the float64
reference, then a few optimiser steps run.

    python examples/train_step.py                            # on a GPU (bf16)
    TRITON_INTERPRET=1 python examples/train_step.py         # on a CPU (fp32, slow)
"""
import os

import torch
import torch.nn.functional as F

import kdagen
from kdagen.spec.reference import kda_gate, naive_recurrent_kda

on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
B, T, D, H, K, V = 1, 40, 32, 2, 16, 16
LOWER = -5.0  # the gate's lower bound: lets the kernels use factorised (tensor-core) diagonal tiles


class KDALayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(D, H * K, bias=False), torch.nn.Linear(D, H * K, bias=False)
        self.v, self.o = torch.nn.Linear(D, H * V, bias=False), torch.nn.Linear(H * V, D, bias=False)
        self.f, self.b = torch.nn.Linear(D, H * K, bias=False), torch.nn.Linear(D, H, bias=False)
        self.A_log = torch.nn.Parameter(torch.zeros(H))
        self.dt_bias = torch.nn.Parameter(torch.zeros(H * K))

    def projections(self, x):
        q, k = self.q(x).view(B, T, H, K), self.k(x).view(B, T, H, K)
        return q, k, self.v(x).view(B, T, H, V), self.f(x).view(B, T, H, K), self.b(x)

    def forward(self, x):  # kdagen, everything fused in the kernels
        q, k, v, f, b = self.projections(x)
        o, _ = kdagen.chunk_kda(q.to(dtype), k.to(dtype), v.to(dtype), f.float(), b.to(dtype),
                                A_log=self.A_log, dt_bias=self.dt_bias, use_gate_in_kernel=True,
                                use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                                lower_bound=LOWER)
        return self.o(o.to(x.dtype).reshape(B, T, H * V))

    def reference(self, x):  # the same layer on the float64 token-by-token recurrence
        q, k, v, f, b = self.projections(x)
        g = kda_gate(f, self.A_log, self.dt_bias, lower_bound=LOWER)
        o, _ = naive_recurrent_kda(F.normalize(q.double(), dim=-1), F.normalize(k.double(), dim=-1),
                                   v.double(), g, torch.sigmoid(b.double()))
        return F.linear(o.reshape(B, T, H * V), self.o.weight.double()).float()


torch.manual_seed(0)
layer = KDALayer().to(device)
x = torch.randn(B, T, D, device=device)
target = torch.randn(B, T, D, device=device)

# one step's gradients, kdagen against the float64 reference
grads = {}
for name, fwd in (("kdagen", layer.forward), ("float64", layer.reference)):
    layer.zero_grad()
    F.mse_loss(fwd(x), target).backward()
    grads[name] = {n: p.grad.detach().double().cpu().clone() for n, p in layer.named_parameters()}
worst = max(((grads["kdagen"][n] - r).norm() / r.norm()).item() for n, r in grads["float64"].items())
print(f"{device} {dtype}: parameter gradients, worst rel. error vs float64 = {worst:.2e}")
assert worst < (2e-2 if dtype == torch.bfloat16 else 1e-4), worst

opt = torch.optim.AdamW(layer.parameters(), lr=1e-2)
losses = []
for step in range(3):
    opt.zero_grad()
    loss = F.mse_loss(layer(x), target)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("loss per step:", " ".join(f"{v:.4f}" for v in losses))
assert losses[-1] < losses[0]
