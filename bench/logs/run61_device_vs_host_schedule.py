"""Run 61 (2026-12-02, H200, torch 2.11.0+cu130, Triton 3.6.0, main at c3ed990): the script passed
inline to the device (`PYTHONPATH=. KDAGEN_CACHE_DIR=/tmp/kdc TRITON_CACHE_DIR=/tmp/tc timeout 200
python3 - <<'EOF' ... EOF`), kept here as it ran.  Output (bench/RESULTS.md, run 61):
    [0, 1, 37, 300, 300, 701, 1000, 2048] 4 device==host True o err 3.76e-03 state err 1.44e-03
    [0, 5, 9000] 2 device==host True o err 3.75e-03 state err 1.81e-03
"""
import torch, kdagen
from kdagen.spec.reference import naive_recurrent_kda
g=torch.Generator().manual_seed(0)
for lens,H in (([0,1,37,300,300,701,1000,2048],4),([0,5,9000],2)):
    T=lens[-1]; N=len(lens)-1
    q=torch.randn(1,T,H,128,generator=g); k=torch.nn.functional.normalize(torch.randn(1,T,H,128,generator=g),dim=-1)
    v=torch.randn(1,T,H,128,generator=g); gg=-5*torch.rand(1,T,H,128,generator=g); b=torch.rand(1,T,H,generator=g)
    h0=0.1*torch.randn(N,H,128,128,generator=g)
    d=lambda t: t.cuda().to(torch.bfloat16)
    x=dict(q=d(q),k=d(k),v=d(v),g=gg.cuda(),beta=d(b),initial_state=h0.cuda(),output_final_state=True,safe_gate=True,lower_bound=-5.0)
    cu=torch.tensor(lens)
    o1,s1=kdagen.chunk_kda(**x,cu_seqlens=cu.cuda())
    o2,s2=kdagen.chunk_kda(**x,cu_seqlens=cu.cuda(),cu_seqlens_cpu=cu)
    r=lambda t:t.double().cpu()
    ro,rs=naive_recurrent_kda(r(x['q']),r(x['k']),r(x['v']),r(x['g']),r(x['beta']),initial_state=h0.double(),output_final_state=True,cu_seqlens=cu)
    rel=lambda a,b:((r(a)-b).norm()/b.norm()).item()
    print(lens,H,'device==host',torch.equal(o1,o2) and torch.equal(s1,s2),'o err %.2e state err %.2e'%(rel(o1,ro),rel(s1,rs)))
