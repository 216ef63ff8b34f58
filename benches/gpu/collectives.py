"""Correctness check and busbw benchmark of torch.distributed collectives (NCCL backend).

Run under torchrun, with or without LD_PRELOAD=libampccl_preload.so; the same script gives the
NCCL-only and the preloaded figures, and `compare.py` puts them side by side.

  --mode check   every collective x dtype x op x size (non-divisible counts included), in place
                 and out of place, on the world group and on a new_group; results are compared
                 with a reference computed locally from the (regenerable) inputs of all ranks,
                 and their SHA-256 digests are written for a bitwise NCCL-only vs preload diff.
  --mode bench   busbw per size for the chosen collectives (CUDA-event timing, median of
                 repeats).
  --mode fault   (with AMPCCL_INJECT_FAULT, see fault.sh) `--calls` allreduces of
                 `--max-bytes`, each synchronised and reported, then time for PyTorch's
                 watchdog to act on the reported error.
"""
import argparse, hashlib, json, os, statistics, sys, time

import torch
import torch.distributed as dist

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32}
OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
       "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}
EPS = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def small_ints(rank, n, dtype, dev, salt=0):
    """Inputs whose sums, products of two, averages over 2/4 ranks are exact in every dtype."""
    i = torch.arange(n, device=dev, dtype=torch.int64)
    v = (i * 7 + rank * 13 + salt * 3) % 23 - 11
    return v.to(dtype)


def random_floats(rank, n, dtype, dev, salt=0):
    g = torch.Generator(device=dev)
    g.manual_seed(1000 * rank + salt + 17)
    return torch.randn(n, generator=g, device=dev, dtype=torch.float32).to(dtype)


def reference(kind, op, inputs):
    """Reduction of the ranks' inputs in rank order, in float64 (ints: int64, wrapped later)."""
    if kind == "ints" or not inputs[0].is_floating_point():
        acc = inputs[0].to(torch.int64)
        for x in inputs[1:]:
            x = x.to(torch.int64)
            acc = {"sum": acc + x, "avg": acc + x, "prod": acc * x,
                   "max": torch.maximum(acc, x), "min": torch.minimum(acc, x)}[op]
        if op == "avg":
            acc = torch.div(acc, len(inputs), rounding_mode="trunc") if not inputs[0].is_floating_point() else acc.double() / len(inputs)
        return acc
    acc = inputs[0].double()
    for x in inputs[1:]:
        x = x.double()
        acc = {"sum": acc + x, "avg": acc + x, "prod": acc * x,
               "max": torch.maximum(acc, x), "min": torch.minimum(acc, x)}[op]
    if op == "avg":
        acc = acc / len(inputs)
    return acc


def bound(dtype, inputs, op):
    """Rounding bound of a reduction of len(inputs) values computed step by step in `dtype`,
    in any order: |err| <= (n - 1 + 1) * eps * sum |x_i| (+1 for the final rounding)."""
    if not dtype.is_floating_point or op in ("max", "min"):
        return None
    s = sum(x.double().abs() for x in inputs)
    if op == "prod":
        s = inputs[0].double().abs()
        for x in inputs[1:]:
            s = s * x.double().abs()
    return len(inputs) * EPS[dtype] * s + 1e-30


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


class Checker:
    def __init__(self, rank, world, dev):
        self.rank, self.world, self.dev = rank, world, dev
        self.results, self.failures = [], 0

    def record(self, name, got, want, tol):
        if got.dtype.is_floating_point:
            err = (got.double() - want.double()).abs()
            if tol is None:
                ok = bool(torch.equal(got.double(), want.double()))
            else:
                ok = bool((err <= tol).all())
            maxerr = float(err.max()) if err.numel() else 0.0
        else:
            w = want.to(torch.int64)
            # Wrap the int64 reference to the element type's width.
            bits = {torch.int32: 32}[got.dtype]
            w = ((w + 2 ** (bits - 1)) % 2 ** bits) - 2 ** (bits - 1)
            ok = bool(torch.equal(got.to(torch.int64), w))
            maxerr = 0.0 if ok else float((got.to(torch.int64) - w).abs().max())
        self.results.append({"name": name, "ok": ok, "maxerr": maxerr, "digest": digest(got)})
        if not ok:
            self.failures += 1
            print(f"[rank {self.rank}] FAIL {name} maxerr={maxerr}", flush=True)

    def run(self, sizes, group=None, tag="world"):
        ranks = list(range(self.world)) if group is None else dist.get_process_group_ranks(group)
        if self.rank not in ranks:
            return
        me, n_ranks = ranks.index(self.rank), len(ranks)
        dev = self.dev
        for dname, dtype in DTYPES.items():
            for kind in ("ints", "rand") if dtype.is_floating_point else ("ints",):
                gen = small_ints if kind == "ints" else random_floats
                for n in sizes:
                    ins = [gen(r, n, dtype, dev) for r in ranks]
                    # Products of small ints overflow the exactly representable range of the 16-bit
                    # floats beyond 2 ranks; they are checked on int32 (wrapping, exact).
                    if dtype == torch.int32:
                        ops = ["sum", "avg", "max", "min", "prod"]
                    elif kind == "ints":
                        ops = ["sum", "avg", "max", "min"]
                    else:
                        ops = ["sum", "avg"]
                    for op in ops:
                        name = f"{tag}/allreduce/{dname}/{kind}/{op}/{n}"
                        x = ins[me].clone()
                        dist.all_reduce(x, op=OPS[op], group=group)
                        want = reference(kind, op, ins)
                        tol = None if kind == "ints" else bound(dtype, ins, op)
                        self.record(name, x, want.to(torch.float64) if dtype.is_floating_point else want, tol)
                        # reduce_scatter: per-rank block n, input n_ranks * n.
                        if op in ("sum", "max", "avg"):
                            big = [torch.cat([gen(r, n, dtype, dev, salt=b) for b in range(n_ranks)]) for r in ranks]
                            want = reference(kind, op, [b[me * n:(me + 1) * n] for b in big])
                            for inplace in (False, True):
                                inp = big[me].clone()
                                out = inp[me * n:(me + 1) * n] if inplace else torch.empty(n, dtype=dtype, device=dev)
                                dist.reduce_scatter_tensor(out, inp, op=OPS[op], group=group)
                                self.record(f"{tag}/reducescatter/{dname}/{kind}/{op}/{n}/{'in' if inplace else 'out'}", out,
                                            want.to(torch.float64) if dtype.is_floating_point else want,
                                            None if kind == "ints" else bound(dtype, [b[me * n:(me + 1) * n] for b in big], op))
                    # all_gather, in and out of place.
                    want = torch.cat(ins)
                    for inplace in (False, True):
                        out = torch.empty(n_ranks * n, dtype=dtype, device=dev)
                        if inplace:
                            out[me * n:(me + 1) * n].copy_(ins[me])
                            dist.all_gather_into_tensor(out, out[me * n:(me + 1) * n], group=group)
                        else:
                            dist.all_gather_into_tensor(out, ins[me].clone(), group=group)
                        self.record(f"{tag}/allgather/{dname}/{kind}/{n}/{'in' if inplace else 'out'}", out, want, None)
                    for root in (0, n_ranks - 1):
                        x = ins[me].clone()
                        dist.broadcast(x, src=ranks[root], group=group)
                        self.record(f"{tag}/broadcast/{dname}/{kind}/{n}/root{root}", x, ins[root], None)
        torch.cuda.synchronize()


def check(args, rank, world, dev):
    c = Checker(rank, world, dev)
    sizes = [int(s) for s in args.sizes.split(",")]
    c.run(sizes)
    if world >= 2:
        # A sub-communicator: the ranks in reverse order (rank numbering differs from the world's).
        sub = dist.new_group(ranks=list(reversed(range(world)))[: max(2, world // 2 * 2)][:world])
        c.run(sizes[-2:], group=sub, tag="newgroup")
    out = {"rank": rank, "world": world, "preload": "ampccl" in os.environ.get("LD_PRELOAD", ""),
           "failures": c.failures, "results": c.results}
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(out, f)
    print(f"[rank {rank}] check: {len(c.results)} results, {c.failures} failures", flush=True)
    return c.failures


def bench(args, rank, world, dev):
    rows = []
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    # Warm up (clocks, NCCL's connections) for ~0.3 s before the first, smallest size: without it
    # the first row of a run is noisy (±30 % between identical runs at 1 MiB).
    w = torch.ones(1 << 22, device=dev)
    for _ in range(300):
        dist.all_reduce(w)
    torch.cuda.synchronize()
    del w
    for op in args.ops.split(","):
        for nbytes in sizes:
            n = nbytes // 4
            if op == "allreduce":
                x = torch.ones(n, device=dev)
                fn = lambda: dist.all_reduce(x)
                bus = 2 * (world - 1) / world
            elif op == "allgather":
                per = n // world
                x = torch.ones(per, device=dev)
                y = torch.empty(per * world, device=dev)
                fn = lambda: dist.all_gather_into_tensor(y, x)
                bus = (world - 1) / world
                nbytes = per * world * 4
            elif op == "reducescatter":
                per = n // world
                x = torch.ones(per * world, device=dev)
                y = torch.empty(per, device=dev)
                fn = lambda: dist.reduce_scatter_tensor(y, x)
                bus = (world - 1) / world
                nbytes = per * world * 4
            elif op == "broadcast":
                x = torch.ones(n, device=dev)
                fn = lambda: dist.broadcast(x, src=0)
                bus = 1.0
            for _ in range(args.warmup):
                fn()
            torch.cuda.synchronize()
            # Enough iterations per repeat for >= 20 ms of work (small sizes are otherwise
            # dominated by launch jitter); the same count on every rank.
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            est = torch.tensor([a.elapsed_time(b) * 1e-3], device=dev, dtype=torch.float64)
            dist.all_reduce(est, op=dist.ReduceOp.MAX)
            iters = int(min(1000, max(args.iters, 0.02 / max(float(est), 1e-6))))
            times = []
            for _ in range(args.repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dist.barrier()
                torch.cuda.synchronize()
                a.record()
                for _ in range(iters):
                    fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / iters)
            times.sort()
            t = times[len(times) // 2]
            # The collective is as slow as its slowest rank.
            tt = torch.tensor([t], device=dev, dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            t = float(tt)
            rows.append({"op": op, "bytes": nbytes, "us": t, "algbw": nbytes / t / 1e3, "busbw": nbytes / t / 1e3 * bus,
                         "repeats_us": times})
            if rank == 0:
                print(f"{op:>14} {nbytes:>12} {t:>10.1f} us {rows[-1]['busbw']:>8.1f} GB/s"
                      f"  (repeats {times[0]:.1f}-{times[-1]:.1f} us, {iters} calls each)", flush=True)
    if rank == 0:
        with open(args.out + ".json", "w") as f:
            json.dump({"world": world, "preload": "ampccl" in os.environ.get("LD_PRELOAD", ""),
                       "alpha": os.environ.get("AMPCCL_ALPHA"), "rows": rows}, f)


def converge(args, rank, world, dev):
    """Per-call busbw of `--calls` consecutive calls per size (one CUDA event pair per call), to
    watch the controller converge; with AMPCCL_LOG=ampccl::split=debug the preload logs the
    split decided for every call."""
    rows = []
    for op in args.ops.split(","):
        for nbytes in [int(x) for x in args.conv_sizes.split(",")]:
            n = nbytes // 4
            if op == "allreduce":
                x = torch.ones(n, device=dev)
                fn, bus = (lambda: dist.all_reduce(x)), 2 * (world - 1) / world
            else:
                per = n // world
                x, y = torch.ones(per, device=dev), torch.empty(per * world, device=dev)
                fn, bus = (lambda: dist.all_gather_into_tensor(y, x)), (world - 1) / world
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.calls)]
            dist.barrier()
            torch.cuda.synchronize()
            for a, b in evs:
                a.record()
                fn()
                b.record()
            torch.cuda.synchronize()
            for i, (a, b) in enumerate(evs):
                t = a.elapsed_time(b) * 1e3
                rows.append({"op": op, "bytes": nbytes, "call": i, "us": t, "busbw": nbytes / t / 1e3 * bus})
    if rank == 0:
        with open(args.out + ".json", "w") as f:
            json.dump({"world": world, "rows": rows}, f)
        for op in args.ops.split(","):
            for nbytes in [int(x) for x in args.conv_sizes.split(",")]:
                r = [x["busbw"] for x in rows if x["op"] == op and x["bytes"] == nbytes]
                print(f"{op:>10} {nbytes:>11}: calls 1-10 {statistics.median(r[:10]):6.1f}  11-30 {statistics.median(r[10:30]):6.1f}"
                      f"  31-50 {statistics.median(r[30:50]):6.1f}  last 20 {statistics.median(r[-20:]):6.1f} GB/s", flush=True)


def fault(args, rank, world, dev):
    """`--calls` allreduces, each synchronised (device-wide: the PCIe side streams too), each
    followed by a line saying it completed; then up to 120 s for PyTorch's watchdog to act on
    the error the preload reports (by default it ends the process)."""
    x = torch.ones(args.max_bytes // 4, device=dev)
    for i in range(args.calls):
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print(f"fault: rank {rank} call {i} done", flush=True)
    time.sleep(120)
    os._exit(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["check", "bench", "converge", "fault"], required=True)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--conv-sizes", default="268435456,1073741824")
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", default="1,1023,262147,1000003")
    p.add_argument("--ops", default="allreduce,allgather")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    t0 = time.time()
    failures = {"check": check, "bench": bench, "converge": converge, "fault": fault}[args.mode](args, rank, world, dev)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"{args.mode} done in {time.time() - t0:.1f} s", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
