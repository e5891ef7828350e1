"""Serving, end to end: chunked prefill, a prefix-cache hit, then decode from a state pool --
each step checked against one prefill call and against the float64 recurrence.

1. Chunked prefill: two prompts, packed with cu_seqlens, prefilled in two pieces (the second
   starts from the first's final state through ``initial_state``): the same output and state
   as prefilling them in one call.
2. Prefix cache: ``return_intermediate_states=True`` gives the state entering every chunk (float32
   with ``intermediate_states_dtype=torch.float32``; FLA's default is the inputs' dtype).  Restoring the snapshot at a chunk boundary and prefilling only the rest of a prompt
   gives the same output and state as the full prompt.
3. Decode: the final states go into slots of a state pool; every step decodes both sequences
   as one packed launch (one token each, cu_seqlens on the device) that updates the pool in
   place -- the call an engine captures in a CUDA graph.

    python examples/prefix_caching.py                           # on a GPU (bf16)
    TRITON_INTERPRET=1 python examples/prefix_caching.py        # on a CPU (fp32, a few seconds)
"""
import os

import torch

import kdagen
from kdagen.config import ChunkFwdConfig
from kdagen.spec.reference import naive_recurrent_kda

on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
TOL = 1e-2 if on_gpu else 1e-5  # bf16 inputs and outputs / the interpreter's exact fp32

config = ChunkFwdConfig()  # the chunk length in use is the config's: snapshots lie at its multiples
C = config.chunk_size
H, HV, K, V = 1, 2, 32, 32
prompt = [2 * C + 5, C + 9]  # two prompts of different lengths, neither a multiple of C
T_decode = 3
split = [C + 3, 11]  # where the chunked prefill cuts each prompt (anywhere: not tied to C)

torch.manual_seed(0)
full = [p + T_decode for p in prompt]


def seq(n):
    L = full[n]
    return dict(q=torch.randn(1, L, H, K), k=torch.nn.functional.normalize(torch.randn(1, L, H, K), dim=-1),
                v=torch.randn(1, L, HV, V), g=-5.0 * torch.sigmoid(torch.randn(1, L, HV, K)),  # g >= -5
                beta=torch.rand(1, L, HV))


seqs = [seq(0), seq(1)]
names = ("q", "k", "v", "g", "beta")


def packed(parts):
    """Pack per-sequence token ranges [(n, a, b)] along T: the op's inputs and cu_seqlens."""
    x = {m: torch.cat([seqs[n][m][:, a:b] for n, a, b in parts], dim=1) for m in names}
    x = {m: t.to(device=device, dtype=torch.float32 if m == "g" else dtype) for m, t in x.items()}
    cu = torch.tensor([0] + [b - a for _, a, b in parts], device=device).cumsum(0)
    return x, cu


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


def unpack(o, parts):
    lens = [b - a for _, a, b in parts]
    return list(torch.split(o, lens, dim=1))


prefill = dict(safe_gate=True, lower_bound=-5.0, config=config)
report = []

# ---- one prefill call over both prompts: outputs, final states, and every chunk's entering state
parts = [(0, 0, prompt[0]), (1, 0, prompt[1])]
x, cu = packed(parts)
o_one, s_one, snapshots = kdagen.chunk_kda(**x, cu_seqlens=cu, output_final_state=True,
                                           return_intermediate_states=True, intermediate_states_dtype=torch.float32,
                                           **prefill)
o_one = unpack(o_one, parts)

# ---- 1. chunked prefill: two calls, the second continuing from the first's final state
first = [(0, 0, split[0]), (1, 0, split[1])]
second = [(0, split[0], prompt[0]), (1, split[1], prompt[1])]
x1, cu1 = packed(first)
o1, s1 = kdagen.chunk_kda(**x1, cu_seqlens=cu1, output_final_state=True, **prefill)
x2, cu2 = packed(second)
o2, s2 = kdagen.chunk_kda(**x2, cu_seqlens=cu2, initial_state=s1, output_final_state=True, **prefill)
for n, (a, b) in enumerate(zip(unpack(o1, first), unpack(o2, second))):
    report.append((f"chunked prefill, sequence {n}: o", rel(torch.cat([a, b], dim=1), o_one[n])))
report.append(("chunked prefill: final states", rel(s2, s_one)))

# ---- 2. prefix cache: restore the snapshot entering chunk c of each prompt, prefill the rest
# snapshots are [1, total chunks, HV, K, V] (FLA's layout for packed sequences); sequence n's
# chunks start after the chunks of those before it
first_chunk = [0, -(-prompt[0] // C)]
c = [2, 1]  # the cached prefix: c[n] whole chunks of prompt n
restored = torch.stack([snapshots[0, first_chunk[n] + c[n]] for n in range(2)])
rest = [(0, c[0] * C, prompt[0]), (1, c[1] * C, prompt[1])]
x3, cu3 = packed(rest)
o3, s3 = kdagen.chunk_kda(**x3, cu_seqlens=cu3, initial_state=restored, output_final_state=True, **prefill)
for n, o in enumerate(unpack(o3, rest)):
    report.append((f"prefix cache, sequence {n}: o after chunk {c[n]}", rel(o, o_one[n][:, c[n] * C:])))
report.append(("prefix cache: final states", rel(s3, s_one)))

# ---- 3. decode from a pool: slots 2 and 0 hold the two sequences; one packed launch per step
pool = torch.zeros(4, HV, K, V, device=device)
slots = torch.tensor([2, 0], device=device, dtype=torch.int32)
pool[slots.long()] = s_one
step_cu = torch.arange(3, device=device)  # one token per sequence, on the device: nothing to read back
out = torch.empty(1, 2, HV, V, device=device, dtype=dtype)
o_dec = [[], []]
for t in range(T_decode):
    xt, _ = packed([(0, prompt[0] + t, prompt[0] + t + 1), (1, prompt[1] + t, prompt[1] + t + 1)])
    kdagen.fused_recurrent_kda(**xt, initial_state=pool, ssm_state_indices=slots, cu_seqlens=step_cu, out=out)
    for n in range(2):
        o_dec[n].append(out[:, n:n + 1].clone())

# ---- everything against the float64 recurrence of each whole sequence
for n in range(2):
    as_given = (seqs[n][m].to(torch.float32 if m == "g" else dtype).double() for m in names)  # the rounded inputs
    ref_o, ref_s = naive_recurrent_kda(*as_given, output_final_state=True)
    o_all = torch.cat([o_one[n]] + o_dec[n], dim=1)
    report.append((f"sequence {n}: prefill + {T_decode} decode steps vs float64: o", rel(o_all, ref_o)))
    report.append((f"sequence {n}: its pool slot vs float64", rel(pool[slots[n].long()][None], ref_s)))

print(f"{device} {dtype}, chunk length {C}, prompts {prompt}, tolerance {TOL:.0e}")
for what, err in report:
    print(f"  {what:<55} rel. error {err:.2e}")
worst = max(err for _, err in report)
assert worst <= TOL, f"worst rel. error {worst:.2e} > {TOL:.0e}"
print(f"worst rel. error {worst:.2e}: OK")
