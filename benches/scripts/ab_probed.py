#!/usr/bin/env python3
"""A/B of two ampccl-perf builds or settings, alternated in one run, the host probed around each pair.

    python3 benches/scripts/ab_probed.py ROUNDS "ENV_A" "ENV_B" [ampccl-perf args...]

Runs `ampccl-perf -g $G` (G default 2) with ENV_A, then with ENV_B (space-separated K=V, e.g.
"AMPCCL_SHM_CMA=0"; "X=1" for none), ROUNDS times; binaries $PERF_A and $PERF_B (default
target/release/ampccl-perf for both). Before and after each pair benches/scripts/handoff_probe.c
(built into $TMPDIR) measures the host: pairs with a probe over 60 us (a slow spell) are reported
apart. Prints per size the median [min] time in us, out of place and in place, of A and B.
"""
import sys, os, subprocess, statistics as st, collections
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROBE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ampccl-handoff-probe")
subprocess.run(["cc", "-O2", "-o", PROBE, os.path.join(HERE, "handoff_probe.c")], check=True)
DEFAULT = os.path.join(ROOT, "target", "release", "ampccl-perf")

R=int(sys.argv[1]); A=sys.argv[2]; B=sys.argv[3]; args=sys.argv[4:]
G=os.environ.get("G","2")
def probe():
    return float(subprocess.run([PROBE],capture_output=True,text=True).stdout.split()[0])
def run(envs, exe):
    e=dict(os.environ); 
    for kv in envs.split():
        k,v=kv.split("=",1); e[k]=v
    out=subprocess.run([exe,"-g",G]+args,capture_output=True,text=True,env=e).stdout
    res={}
    for l in out.splitlines():
        f=l.split()
        if f and f[0].isdigit() and len(f)>=10:
            res[int(f[0])]=(float(f[5]),float(f[9]))
    return res
clean=collections.defaultdict(list); spell=collections.defaultdict(list); ns=0
for r in range(R):
    p0=probe()
    ra=run(A, os.environ.get("PERF_A", DEFAULT)); rb=run(B, os.environ.get("PERF_B", DEFAULT))
    p1=probe()
    d = clean if max(p0,p1) < 60 else spell
    if d is spell: ns+=1
    for s in ra: d[(s,'A')].append(ra[s]); d[(s,'B')].append(rb[s])
print(f"A = {A}  B = {B}; {R-ns} clean pairs, {ns} in a spell (median [min], us)")
f=lambda x: f"{st.median(x):8.1f} [{min(x):.0f}]" if x else "-"
for name,d in (("clean",clean),("spell",spell)):
    if not d: continue
    print(name); print(f"{'bytes':>10} {'A out':>15} {'B out':>15} {'A in':>15} {'B in':>15}")
    for s in sorted({k[0] for k in d}):
        a,b=d[(s,'A')],d[(s,'B')]
        print(f"{s:>10} {f([x[0] for x in a]):>15} {f([x[0] for x in b]):>15} {f([x[1] for x in a]):>15} {f([x[1] for x in b]):>15}")
