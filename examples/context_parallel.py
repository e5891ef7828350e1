"""Context parallelism: one packed batch of long sequences split along T over the ranks of a
process group, each rank running chunk_kda on its own tokens with ``cp_context``.

    torchrun --standalone --nproc-per-node 2 examples/context_parallel.py

On GPUs the ranks use NCCL (one GPU each); without CUDA they use gloo on CPU and the kernels run
in Triton's interpreter (tiny shapes).  Every rank checks its outputs, the final states and
the gradients of a training call, and the outputs and final states of a prefill (inference) call,
against the one-process call on all tokens.  (A prefill rank that continues a sequence runs the op's
forward in two phases around the collective; a training rank widens its values: kdagen.ops.cp.)
"""
import os

if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kdagen  # noqa: E402


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda") if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    H, K, V = (4, 128, 128) if cuda else (2, 16, 16)
    unit = 2048 if cuda else 24
    lengths = [unit * world - unit // 3, unit // 3 + unit * world // 2, unit * world // 2]  # over rank edges
    T = sum(lengths)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=dev)

    g = torch.Generator().manual_seed(0)  # every rank draws the same global inputs

    def draw(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dev)
    q, k, v = draw(1, T, H, K), draw(1, T, H, K), draw(1, T, H, V)
    gate = -torch.rand(1, T, H, K, generator=g).to(dev) * 0.5
    beta = torch.rand(1, T, H, generator=g).to(dev)
    h0 = draw(len(lengths), H, K, V, scale=0.1)
    do, dht = draw(1, T, H, V), draw(len(lengths), H, K, V)

    ctx = kdagen.build_cp_context(cu, group=dist.group.WORLD)
    s, e = ctx.rank_start, ctx.rank_end
    xs = [t[:, s:e].to(dtype).requires_grad_() for t in (q, k, v)] + [t[:, s:e].requires_grad_() for t in (gate, beta)]
    h0_local = h0.clone().requires_grad_()
    o, ht = kdagen.chunk_kda(*xs, initial_state=h0_local, output_final_state=True, use_qk_l2norm_in_kernel=True,
                             cp_context=ctx)
    ((o.float() * do[:, s:e]).sum() + (ht * dht).sum()).backward()
    # this rank holds the final states of the sequences ending on it; their sum over ranks is the whole
    dist.all_reduce(ht_sum := ht.detach().clone())
    dist.all_reduce(dh0 := h0_local.grad.clone())
    # prefill: the same tokens, no gradients
    with torch.no_grad():
        po, pht = kdagen.chunk_kda(*[x.detach() for x in xs], initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, cp_context=ctx)
    dist.all_reduce(pht)

    # the one-process call on all tokens
    ref = [t.to(dtype).requires_grad_() for t in (q, k, v)] + [t.clone().requires_grad_() for t in (gate, beta)]
    rh0 = h0.clone().requires_grad_()
    ro, rht = kdagen.chunk_kda(*ref, initial_state=rh0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                               cu_seqlens=cu)
    ((ro.float() * do).sum() + (rht * dht).sum()).backward()

    def err(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()
    errs = {"o": err(o, ro[:, s:e]), "final state": err(ht_sum, rht), "d initial_state": err(dh0, rh0.grad),
            "prefill o": err(po, ro[:, s:e]), "prefill final state": err(pht, rht)}
    errs.update({f"d{n}": err(x.grad, r.grad[:, s:e]) for n, x, r in zip(("q", "k", "v", "g", "beta"), xs, ref)})
    worst = max(errs.values())
    tol = 5e-2 if cuda else 1e-4  # bf16 against bf16 on a GPU
    print(f"rank {rank}/{world}: tokens [{s}, {e}) local cu_seqlens {ctx.cu_seqlens.tolist()}; rel. error vs the "
          f"one-process call: " + ", ".join(f"{n} {v:.1e}" for n, v in errs.items())
          + (" OK" if worst <= tol else " FAILED"), flush=True)
    dist.destroy_process_group()
    if worst > tol:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
