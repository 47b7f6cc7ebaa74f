# The list-scheduling model of the fused attention's grids (call2, README): blocks of given work
# dispatched in order to the first free slot (blocks an SM times 132 SMs), in the grid's own order
# and heaviest first; prints each makespan over the ideal (total work over slots).
import heapq
def sim(jobs, m):
    h=[0.0]*m; heapq.heapify(h); end=0
    for j in jobs:
        t=heapq.heappop(h); t+=j; end=max(end,t); heapq.heappush(h,t)
    return end
def report(name, jobs, m):
    W=sum(jobs); nat=sim(jobs,m); lpt=sim(sorted(jobs,reverse=True),m)
    print(f"{name}: blocks {len(jobs)} ideal {W/m:.1f} natural {nat:.1f} ({nat/(W/m):.3f}) heaviest-first {lpt:.1f} ({lpt/(W/m):.3f})")
# llama: dkdv grid (32 kb, 8 kvh, 4 b), work 4*(32-kb); 3 blocks/SM
nt=32
report("llama dkdv", [4*(nt-kb) for b in range(4) for g in range(8) for kb in range(nt)], 132*3)
# dq: grid (16 qb pairs, 32 heads, 4 b), work = key tiles of tile 2qb+1 = 2qb+2 (max of pair), 2 blocks/SM
report("llama dq", [2*qb+2 for b in range(4) for h in range(32) for qb in range(16)], 132*2)
# fwd MT2: same as dq shape, 2 blocks/SM
report("llama fwd mt2", [2*qb+2 for b in range(4) for h in range(32) for qb in range(16)], 132*2)
report("llama fwd mt1 b4", [qb+1 for b in range(4) for h in range(32) for qb in range(32)], 132*4)
# seed b32: T 512 -> 8 tiles, NH 16, KVH 16, B 32
nt=8
report("seed dkdv", [1*(nt-kb) for b in range(32) for g in range(16) for kb in range(nt)], 132*3)
report("seed dq", [2*qb+2 for b in range(32) for h in range(16) for qb in range(4)], 132*2)
report("seed fwd mt2", [2*qb+2 for b in range(32) for h in range(16) for qb in range(4)], 132*2)
