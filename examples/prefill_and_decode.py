"""Prefill a batch with the chunkwise form, then decode token by token with the recurrent
form from the prefill's final state -- and check both against the float64 reference.

    python examples/prefill_and_decode.py            # on a GPU (bf16)
    TRITON_INTERPRET=1 python examples/prefill_and_decode.py   # on a CPU (fp32, slow)
"""
import os

import torch

import kdagen
from kdagen.spec.reference import naive_recurrent_kda

on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
B, T_prefill, T_decode, H, K, V = 2, 100, 4, 2, 64, 64
T = T_prefill + T_decode

torch.manual_seed(0)
q = torch.randn(B, T, H, K)
k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
v = torch.randn(B, T, H, V)
g = -5.0 * torch.sigmoid(torch.randn(B, T, H, K))  # a gate bounded below by -5
beta = torch.rand(B, T, H)
cast = lambda x: x.to(device=device, dtype=dtype)  # noqa: E731

# prefill: chunkwise form; safe_gate promises g >= lower_bound (faster diagonal tiles)
o_pre, state = kdagen.chunk_kda(cast(q[:, :T_prefill]), cast(k[:, :T_prefill]), cast(v[:, :T_prefill]),
                                g[:, :T_prefill].to(device), cast(beta[:, :T_prefill]),
                                output_final_state=True, safe_gate=True, lower_bound=-5.0)
# decode: one token at a time, the state pool updated in place (slot n for sequence n)
slots = torch.arange(B, device=device, dtype=torch.int32)
outs = []
for t in range(T_prefill, T):
    o_t, state = kdagen.fused_recurrent_kda(cast(q[:, t:t + 1]), cast(k[:, t:t + 1]), cast(v[:, t:t + 1]),
                                            g[:, t:t + 1].to(device), cast(beta[:, t:t + 1]),
                                            initial_state=state, ssm_state_indices=slots)
    outs.append(o_t)
o = torch.cat([o_pre] + outs, dim=1)

ref, _ = naive_recurrent_kda(q, k, v, g, beta)
err = ((o.double().cpu() - ref).norm() / ref.norm()).item()
print(f"{device} {dtype}: prefill {T_prefill} + decode {T_decode} tokens, rel. error vs float64 = {err:.2e}")
assert err < (6e-3 if dtype == torch.bfloat16 else 1e-5), err
