"""Speculative decoding (MTP or a draft model) with a state pool, as a serving engine wires it.

Each step verifies 1 + k tokens per sequence (k drafts, k may differ per sequence and be 0) in one packed
launch.  The engine keeps, per sequence, a row of pool slots -- one per token of a step -- in a 2-D
``ssm_state_indices`` [N, T_max]: the kernel writes token t's state to slot [n, t] as it consumes it.  After
verification the engine knows how many tokens each sequence accepted; it passes that as
``num_accepted_tokens`` [N] to the next step, which starts sequence n from slot [n, accepted - 1] -- the
state after its last accepted token.  Nothing is copied between steps and nothing is read back to the host,
so on a GPU the step is captured once in a CUDA graph and replayed.

1. Prefill: the prompts, packed, through ``chunk_kda`` with ``output_final_state``; the final states go
   into each sequence's first slot (accepted = 1 for the first step).
2. Draft-and-verify steps with random draft lengths and a random accepted prefix; every accepted token's
   output and the state after it are checked against the float64 recurrence run over the accepted tokens
   only (what plain one-token decoding of them gives).

The step's geometry is fixed for the graph: sequence n's tokens always sit at rows n * W .. of a buffer of
N * W token rows (W = 1 + K_MAX), and the rows a sequence does not use this step belong to a padding
"sequence" after it whose slots are all -1 (its o is 0 and it writes nothing): 2 N sequences in cu_seqlens,
real and padding in turn, every one at most W tokens long (T_max = W covers them all).

    python examples/speculative_decoding.py                         # on a GPU: bf16, a CUDA graph
    TRITON_INTERPRET=1 python examples/speculative_decoding.py      # on a CPU (fp32, a few seconds)
"""
import os

import torch

import kdagen
from kdagen.spec.reference import naive_recurrent_kda

on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
TOL = 2e-2 if on_gpu else 1e-5  # bf16 inputs and outputs / the interpreter's exact fp32

N, H, HV, K, V = 3, 1, 2, 32, 32
K_MAX = 3  # drafts per step: each step verifies 1 + k <= 1 + K_MAX tokens per sequence
W = 1 + K_MAX  # slots per sequence (T_max of ssm_state_indices)
STEPS = 4
prompts = [21, 9, 14]
names = ("q", "k", "v", "g", "beta")
gen = torch.Generator().manual_seed(0)


def tokens(L):
    """L tokens of one sequence's inputs (float32 on the host)."""
    return dict(q=torch.randn(1, L, H, K, generator=gen),
                k=torch.nn.functional.normalize(torch.randn(1, L, H, K, generator=gen), dim=-1),
                v=torch.randn(1, L, HV, V, generator=gen),
                g=-5.0 * torch.sigmoid(torch.randn(1, L, HV, K, generator=gen)),
                beta=torch.rand(1, L, HV, generator=gen))


def on_device(x):
    return {m: t.to(device=device, dtype=torch.float32 if m == "g" else dtype) for m, t in x.items()}


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()


# ---- the pool: sequence n owns slots n*W .. n*W + W - 1 (an engine's allocator would hand them out)
pool = torch.zeros(N * W, HV, K, V, device=device)
rows = torch.arange(N * W, dtype=torch.int32, device=device).view(N, W)

# ---- 1. prefill, packed, into each sequence's first slot
prompt_x = [tokens(L) for L in prompts]
x = on_device({m: torch.cat([p[m] for p in prompt_x], dim=1) for m in names})
cu = torch.tensor([0] + prompts, device=device).cumsum(0)
_, final = kdagen.chunk_kda(**x, cu_seqlens=cu, output_final_state=True, safe_gate=True, lower_bound=-5.0)
pool[rows[:, 0].long()] = final
# the float64 reference state of every sequence after its prompt
ref_state = [naive_recurrent_kda(*(p[m].double() for m in names), output_final_state=True)[1] for p in prompt_x]
report = [("prefill: final states vs float64", max(rel(final[n:n + 1], ref_state[n]) for n in range(N)))]

# ---- the step's static buffers (what a CUDA graph replays): inputs, offsets, slot rows, accepted counts
T_BUF = N * W
buf = on_device({m: torch.zeros(1, T_BUF, *t.shape[2:]) for m, t in tokens(1).items()})
buf_cu = torch.zeros(2 * N + 1, dtype=torch.int64, device=device)
buf_rows = torch.full((2 * N, W), -1, dtype=torch.int32, device=device)  # odd rows: the padding sequences
buf_rows[0::2] = rows
buf_acc = torch.ones(2 * N, dtype=torch.int32, device=device)
out = torch.zeros(1, T_BUF, HV, V, dtype=dtype, device=device)


def step(state_pool):
    """One verify launch (the call an engine captures)."""
    kdagen.fused_recurrent_kda(**buf, initial_state=state_pool, ssm_state_indices=buf_rows,
                               num_accepted_tokens=buf_acc, cu_seqlens=buf_cu, out=out)


if on_gpu:  # compile and plan outside the capture (on a scratch pool), then capture one step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(pool.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(pool)
    run = graph.replay
else:
    run = lambda: step(pool)  # noqa: E731

# ---- 2. draft-and-verify steps
for s in range(STEPS):
    lens = [1 + int(torch.randint(0, K_MAX + 1, (1,), generator=gen)) for _ in range(N)]
    lens[s % N] = 1  # (a step without drafts for one sequence)
    new = [tokens(L) for L in lens]
    for n in range(N):  # sequence n's tokens at rows n * W ..; the rest of its W rows are padding
        for m in names:
            buf[m][:, n * W:n * W + lens[n]].copy_(new[n][m])
    buf_cu.copy_(torch.tensor([0] + [x for L in lens for x in (L, W - L)]).cumsum(0))
    run()
    # verification (here: a random accepted prefix of each sequence's 1 + k tokens)
    accepted = [1 + int(torch.randint(0, L, (1,), generator=gen)) for L in lens]
    starts = [n * W for n in range(N)]
    worst = 0.0
    for n in range(N):
        acc_x = {m: new[n][m][:, :accepted[n]].double() for m in names}  # the accepted tokens only
        ro, rs = naive_recurrent_kda(*acc_x.values(), initial_state=ref_state[n], output_final_state=True)
        worst = max(worst, rel(out[:, starts[n]:starts[n] + accepted[n]], ro),
                    rel(pool[rows[n, accepted[n] - 1].long()][None], rs))
        ref_state[n] = rs
    report.append((f"step {s}: tokens {lens}, accepted {accepted}: accepted o and state vs float64", worst))
    buf_acc[0::2].copy_(torch.tensor(accepted))  # the next step starts from slot [n, accepted - 1]

print(f"device {device}, inputs {dtype}, pool {pool.dtype}, {'CUDA graph replay' if on_gpu else 'eager'}")
for what, err in report:
    print(f"{what}: rel. error {err:.2e}")
assert all(err < TOL for _, err in report), "an error above the tolerance"
print("OK")
