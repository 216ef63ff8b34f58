#!/usr/bin/env python3
"""Across emulated hosts, in one run with alternated rounds: ampccl, the network ceiling
(iperf3), libfabric's ceiling (fabtests), Gloo, Intel MPI and Open MPI, one rank per host, f32
(sum), medians per size.

    python3 benches/scripts/compare_hosts.py --rounds 5 --hosts 2 --op allreduce \\
        --sizes 8,1M,16M,64M --peers ampccl,iperf3,gloo,impi,ompi --out-dir DIR [--rate 5gbit]
    python3 benches/scripts/compare_hosts.py --rounds 5 --hosts 2 --op sendrecv \\
        --sizes 8,1M,16M,64M --peers ampccl-ofi,fabtests,ampccl-ofi2,fabtests2,impi --out-dir DIR
    ampccl-perf plot --out cmp.png DIR/allreduce-*.csv

Needs root and the release binaries `ampccl-hosts` and `ampccl-perf` ($AMPCCL_HOSTS and
$AMPCCL_PERF, else $CARGO_TARGET_DIR/release, else target/release); the peers come from
benches/peers/install.sh (--gloo for torch) under $PEERS_HOME (default ~/.cache/ampccl-peers),
fabtests from benches/peers/fabtests.sh (there too), iperf3 from the system. A peer that is not
installed is skipped with one line saying so.

Every launch makes its own K emulated hosts with `ampccl-hosts -k K [--rate R] [--tcp-cc C]
[--quickack] -- ...` (tests/src/hosts.rs: host i is 10.213.0.<i+1>, a network, UTS and mount
namespace each, veths on a bridge; `--rate` shapes every host's link with tc tbf, `--tcp-cc` sets
every host's TCP congestion control, which new namespaces otherwise take from this machine;
`--quickack` makes every host acknowledge each TCP segment at once, so that a latency comparison
does not hinge on when each connection's kernel acknowledges, which depends on the sizes it
carried before: docs/PERFORMANCE.md, "Where `ofi` trails") and they are gone
when it ends; every launch sets up the same hosts. Per variant:

  ampccl      `ampccl-hosts -k K -- ampccl-perf -o OP -b S -e S -n N -w W --csv F`, one launch
              per size (ampccl-perf's rank-per-host mode: MASTER_ADDR/RANK/WORLD_SIZE from
              ampccl-hosts). --pin-ampccl runs each rank under `taskset -c RANK%CPUS`, as the
              peers below are pinned; by default ampccl-perf decides (it does not pin there).
              Pin for latency: the emulated hosts share this machine's CPUs, and an unpinned
              launch of 1000 calls may start with both ranks on one CPU until the scheduler
              parts them (8 B ping-pong over ofi, 5 launches: 8.5-16.5 us unpinned, 8.4-9.9
              pinned); not for bandwidth: a rank pinned to one CPU with its ofi progress thread
              swung between 39 and 83 ms for a 64 MiB sendrecv (42-49 ms unpinned, 6 launches
              each). Ping-pong runs as many round trips as fi_rdm_pingpong's launch (below)
              after a tenth of them, the other ops ampccl-perf's default counts.
  ampccl-ofi  the same over the ofi provider on libfabric's tcp;ofi_rxm (AMPCCL_TRANSPORT=ofi,
              AMPCCL_OFI_PROVIDER=tcp;ofi_rxm): the system's libfabric (Debian: 1.17).
  ampccl-ofi2 the same over the ofi provider on Intel MPI's libfabric (2.4) and its tcp provider
              (reliable datagrams of its own, automatic progress): AMPCCL_OFI_PROVIDER=tcp,
              LD_LIBRARY_PATH=FI_PROVIDER_PATH=$PEERS_HOME/impi/lib.
  gloo        `ampccl-hosts -k K -- torch/bin/python peer_bench.py --backend gloo`: each rank
              is a torch.distributed process (init_method env://, GLOO_SOCKET_IFNAME=eth0,
              pinned to CPU RANK%CPUS by peer_bench.py), all sizes in one launch.
  impi        rank 0 of `ampccl-hosts -k K -- sh -c '[ $RANK = 0 ] && exec mpirun ...'` runs
              Intel MPI's hydra in host 0 (the other ranks exit at once; the hosts stay while
              rank 0 runs); hydra starts its proxy in each host through the ssh stand-in
              benches/scripts/hosts_ssh.sh (I_MPI_HYDRA_BOOTSTRAP=ssh,
              I_MPI_HYDRA_BOOTSTRAP_EXEC), FI_PROVIDER=tcp, I_MPI_HYDRA_IFACE=FI_TCP_IFACE=eth0
              (the hosts' names do not resolve). `-hosts` are the addresses; one MPMD section
              per host pins its rank to CPU RANK%CPUS (see "Binding" below). IMB-MPI1 OP
              -npmin K -msgsize B -iter N
              -iter_policy off, one launch per size, t_max taken: the slowest rank's mean
              time per call, as ampccl-perf and peer_bench.py report (IMB's t_avg of a
              broadcast averages in the root, which returns once its data sits in socket
              buffers). IMB's Allgather size is one rank's block: B = S/K; its Reduce_scatter
              size is the whole input.
  ompi        the same with Open MPI 5's mpirun: `--prtemca plm_ssh_agent hosts_ssh.sh --host
  ompi-yield  10.213.0.1,... --map-by rankfile:file=F --mca btl tcp,self --mca
              btl_tcp_if_include 10.213.0.0/24 --mca oob_tcp_if_include 10.213.0.0/24`, running
              peer_bench.py --backend mpi (mpi4py); the rankfile puts rank r on host r, CPU
              r%CPUS (see "Binding"). `ompi` is the default progress, `ompi-yield` adds `--mca
              mpi_yield_when_idle 1`. --peers ompi runs both; ompi-default or ompi-yield only one.
  iperf3      `ampccl-hosts [--rate R] --iperf3 "-t T"`, then "-t T -P 4", then "-t T --bidir"
              (always 2 hosts: server in host 0, client in host 1): receiver rates, in GB/s
              (10^9 bytes/s) per direction: single stream, the sum of 4 streams, and each
              direction of --bidir (1->0 is the client's sending side, TX-C).
  fabtests    libfabric's own benchmarks, the ceiling of what libfabric carries between two hosts
  fabtests2   (always 2 hosts: `ampccl-hosts -k 2 -- sh -c ...`, the server in host 0 with
              `-s 10.213.0.1`, the client in host 1 given 10.213.0.1; FI_TCP_IFACE=eth0), one
              launch per size and test, `-e rdm -m -S S -I N` (N for about 0.2 s per size),
              each side pinned as ampccl's ranks are (--pin-ampccl):
                write      fi_rma_bw -o write -W W: both sides write S-byte messages to each
                           other at once, W in flight (at most 128 MiB, at most 64); GB/s per
                           direction, as a sendrecv's algbw (sizes up to the provider's inject
                           size go by fi_inject_write: the rate of posting, not of delivery)
                writedata  fi_rma_bw -o writedata -W W: host 1 writes to host 0 (one direction)
                pingpong   fi_rdm_pingpong: us = half the round trip (fabtests' usec/xfer)
                pingpong-mixed  the same on a connection that first carried messages of half
                           the size (`-S r:S/2,S/2,S`), as any application's carries several sizes
                           (ampccl's its control messages too): after messages of more than one
                           segment and a smaller size (4 KiB after 2 KiB, not after 1 KiB), the
                           kernel acknowledges a message not on its arrival but from the
                           reader's `recv`, on the critical path
                pingpong-fd  fi_rdm_pingpong -c fd: waits on its completion queue's file
                           descriptor, as ampccl's default (AMPCCL_OFI_WAIT=fd) does once idle,
                           instead of spinning on it (fabtests' default, which a rank with
                           AMPCCL_OFI_WAIT=poll approaches)
              Of the two sides' figures, the slower is taken (ampccl-perf: the slowest rank).
              `fabtests` is fabtests 1.17.1 on the system's libfabric (1.17) with -p
              'tcp;ofi_rxm', the same as ampccl-ofi; `fabtests2` is fabtests 2.4.0 on Intel MPI's
              libfabric 2.4 with -p tcp (LD_LIBRARY_PATH=FI_PROVIDER_PATH=$PEERS_HOME/impi/lib),
              the same as ampccl-ofi2 and impi. Binaries: $PEERS_HOME/fabtests-1.17.1/bin and
              fabtests-2.4.0/bin (benches/peers/fabtests.sh [--version 1.17.1]).

Binding: the emulated hosts share this machine's CPUs and each sees all of them, so an MPI
launcher's default binding (Open MPI: --bind-to core; Intel MPI: I_MPI_PIN) puts the rank of
every host on CPU 0: two busy-polling ranks then share one core and take turns per scheduler
tick (the "4 ms steps per exchange" of Open MPI's default progress across emulated hosts come
from this, not from the network). By default (--mpi-pin per-host) each host's rank is bound, all
its threads, to CPU r%CPUS, as ranks on separate machines each have their own cores;
--mpi-pin default keeps the launchers' binding to show that effect. Gloo's ranks pin their main
thread (peer_bench.py); ampccl's ranks, and fabtests' with them, are not pinned unless
--pin-ampccl.

Iteration counts are peer_bench.py's (about 256 MiB moved per size, 20..1000 calls, a quarter
warm-up) for ampccl, Gloo, Open MPI and IMB (`-iter N -iter_policy off`; IMB warms up on its
own). Sizes are nccl-tests' (the larger buffer: allgather's gathered output, reducescatter's
input, rounded down to whole f32 blocks per rank); a size that rounds to 0 bytes is left out.
The times are out-of-place (in place for broadcast), the slowest rank's mean, as in
compare_peers.py.

Each round runs every (op, variant) once in the order of --op and --peers, iperf3 once per
round where it stands in --peers; before each round the script waits (--wait-quiet) for
builds of other people on the machine to end. Unless --no-probe, every launch (one size of one
variant) runs outside the host's slow spells (compare_peers.py's HostProbe): the script waits
for the host to leave one before the launch (--wait-spell), probes again after it, and runs it
again where a spell began meanwhile (at most --spell-tries runs; a launch still in a spell then
is left out of that round). Spells last tens of seconds and are frequent: of 10 back-to-back
64 MiB sendrecv launches over ofi, the three next to a probe of 200-240 us (against 13-25 us)
took 67-85 ms, the others 35-56 ms (the kernel's copies into socket buffers, read on the other
CPU, cost 2.5x), so a probe per round of several minutes let many launches inside spells into
the medians. A launch that fails or runs past --timeout is reported on stderr with its last
lines and left out of that round (the median is over the rounds that gave a figure; the table
says how many when fewer).

Ops: allreduce, allgather, reducescatter, broadcast, sendrecv (2 hosts: each rank sends S
bytes to its pair and receives S; ampccl-perf -o sendrecv, IMB Sendrecv) and pingpong (2 hosts:
rank 0 sends S bytes, rank 1 sends them back; time = half the round trip; ampccl-perf -o
pingpong, IMB PingPong, bounded by fi_rdm_pingpong). Gloo and Open MPI have neither and are
left out of those two.

Output: per op a markdown table of the medians, time per call (us) and algbw (GB/s) per size
and variant, with `best peer / ampccl` (the fastest peer's time over ampccl's: > 1 is ampccl
faster), `ampccl / iperf3 1-stream` (algbw over the single-stream ceiling) and `ampccl-ofi /
fabtests write`, `ampccl-ofi2 / fabtests2 write` (algbw over fi_rma_bw -o write's GB/s of the
same size and libfabric; for pingpong `... / fabtests2 pingpong` and `... / fabtests2
pingpong-mixed`, `... pingpong-fd`, time over fi_rdm_pingpong's, < 1.3x is the latency
target); then the iperf3
ceilings and the fabtests figures per size. Files in --out-dir:
  compare_hosts.csv   the medians: op,hosts,variant,size,bytes,rounds,time_us,algbw_gbs,
                      busbw_gbs,wrong (wrong: results checked by ampccl-perf and peer_bench.py;
                      IMB does not check, empty)
  ceilings.csv        iperf3 medians: variant,rounds,gbs (per direction)
  fabtests.csv        fabtests medians: variant,test,size,bytes,rounds,usec_xfer,gbs (each
                      test's usec/xfer and MB/sec/1000)
  rounds.csv          every figure of every round: round,op,variant,size,bytes,time_us,gbs,
                      wrong (the iperf3 rows have op iperf3 and only gbs; the fabtests rows op
                      fabtests, variant "fabtests2 write" etc., usec/xfer and GB/s)
  OP-VARIANT.csv      the medians in ampccl-perf's CSV format, for `ampccl-perf plot`
"""
import argparse, atexit, csv, io, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from peer_bench import BUS, HEADER, iterations, parse_size  # noqa: E402
from compare_peers import HostProbe, SPELL_US, builders, perf_exe, placement, wait_quiet  # noqa: E402

PEERS_HOME = os.environ.get("PEERS_HOME", os.path.expanduser("~/.cache/ampccl-peers"))
HOSTS_SSH = os.path.join(HERE, "hosts_ssh.sh")
PEER_BENCH = os.path.join(HERE, "peer_bench.py")
SUBNET = "10.213.0.0/24"  # tests/src/hosts.rs: host i is 10.213.0.<i+1>
OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "sendrecv", "pingpong")
IMB = {"allreduce": "Allreduce", "allgather": "Allgather", "reducescatter": "Reduce_scatter",
       "broadcast": "Bcast", "sendrecv": "Sendrecv", "pingpong": "PingPong"}
BUS = dict(BUS, sendrecv=lambda n: 1.0, pingpong=lambda n: 1.0)
# Ops that pair ranks and move no reduction.
PAIRED = ("sendrecv", "pingpong")
VARIANTS = ("ampccl", "ampccl-ofi", "ampccl-ofi2", "gloo", "impi", "ompi", "ompi-yield")
TITLES = {"ampccl": "ampccl", "ampccl-ofi": "ampccl ofi", "ampccl-ofi2": "ampccl ofi2", "gloo": "Gloo",
          "impi": "Intel MPI", "ompi": "Open MPI", "ompi-yield": "Open MPI yield"}
NAMES = {"ampccl": "ampccl", "ampccl-ofi": "ampccl-ofi", "ampccl-ofi2": "ampccl-ofi2", "gloo": "gloo",
         "impi": "intel-mpi", "ompi": "open-mpi", "ompi-yield": "open-mpi-yield"}
# Variants without the op (peer_bench.py has no sendrecv or pingpong).
LACKS = {"gloo": PAIRED, "ompi": PAIRED, "ompi-yield": PAIRED}
# The ofi provider over libfabric's tcp;ofi_rxm (the system's libfabric), and over Intel MPI's
# libfabric 2.x and its tcp provider.
OFI_ENV = {"AMPCCL_TRANSPORT": "ofi", "AMPCCL_OFI_PROVIDER": "tcp;ofi_rxm"}
IMPI_LIB = f"{PEERS_HOME}/impi/lib"
OFI2_ENV = {"AMPCCL_TRANSPORT": "ofi", "AMPCCL_OFI_PROVIDER": "tcp", "LD_LIBRARY_PATH": IMPI_LIB,
            "FI_PROVIDER_PATH": IMPI_LIB}
# fabtests variant: (its bin directory, -p provider, environment); the ampccl variant it bounds.
FABTESTS = {"fabtests": (f"{PEERS_HOME}/fabtests-1.17.1/bin", "tcp;ofi_rxm", {"FI_TCP_IFACE": "eth0"}),
            "fabtests2": (f"{PEERS_HOME}/fabtests-2.4.0/bin", "tcp",
                          {"FI_TCP_IFACE": "eth0", "LD_LIBRARY_PATH": IMPI_LIB, "FI_PROVIDER_PATH": IMPI_LIB})}
FAB_OF = {"ampccl-ofi": "fabtests", "ampccl-ofi2": "fabtests2"}
FAB_TESTS = {"write": ["fi_rma_bw", "-o", "write"], "writedata": ["fi_rma_bw", "-o", "writedata"],
             "pingpong": ["fi_rdm_pingpong"], "pingpong-mixed": ["fi_rdm_pingpong"],
             "pingpong-fd": ["fi_rdm_pingpong", "-c", "fd"]}


def fab_size(test, size):
    """fabtests' `-S` for `test` at `size`: the size, or for pingpong-mixed a range that runs
    messages of half the size on the connection first (`r:START,INC,END`, which fabtests 1.17
    and 2.x both read; their lists, `l:`, only 2.x)."""
    if test == "pingpong-mixed" and size > 1:
        return f"r:{size // 2},{size // 2},{size}"
    return str(size)


def fab_iterations(size):
    """Iterations (`-I`) of one fabtests launch: about 0.2 s at 1 GB/s and 20 us per message,
    10..20000."""
    return max(10, min(20000, int(0.2 / (20e-6 + size / 1e9))))


# Host 0 runs the server, host 1 the client (retried while the server is not listening yet).
FAB_SH = """out=$1; shift
if [ "$RANK" = 0 ]; then exec timeout --foreground 300 "$@" -s 10.213.0.1 >"$out.0" 2>&1; fi
for try in 1 2 3 4 5 6 7 8 9 10; do
  sleep 0.3; timeout --foreground 300 "$@" 10.213.0.1 >"$out.1" 2>&1 && exit 0
done
exit 1"""
IPERF = {"single": "-t {t}", "P4": "-t {t} -P 4", "bidir": "-t {t} --bidir"}
CEILINGS = ("single", "P4", "bidir 1->0", "bidir 0->1")
CEIL_TITLES = {"single": "iperf3 1 stream", "P4": "iperf3 -P 4 (sum)",
               "bidir 1->0": "iperf3 --bidir 1->0", "bidir 0->1": "iperf3 --bidir 0->1"}
CEILING_PEERS = ("iperf3", "fabtests", "fabtests2")  # run once per round, not per op
# Sent to rank 0 only: the launchers start every host's rank themselves.
RANK0 = ["sh", "-c", '[ "$RANK" = 0 ] || exit 0; exec "$@"', "rank0"]


class Failed(Exception):
    pass


def hosts_exe():
    if "AMPCCL_HOSTS" in os.environ:
        return os.environ["AMPCCL_HOSTS"]
    return os.path.join(os.path.dirname(perf_exe()), "ampccl-hosts")


def addr(i):
    return f"10.213.0.{i + 1}"


def launch(cmd, env, timeout):
    """Runs cmd in a session of its own (ampccl-hosts and every rank it starts); on timeout
    kills that process group. Returns stdout; raises Failed with the last lines otherwise."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise Failed(f"ran past {timeout} s\n" + tail(out, err))
    if p.returncode != 0:
        raise Failed(f"exit status {p.returncode}\n" + tail(out, err))
    return out


def tail(out, err, n=12):
    lines = (out or "").splitlines()[-n:] + (err or "").splitlines()[-n:]
    return "\n".join("    " + l for l in lines)


def effective(op, size, k):
    """Bytes an op of nccl-tests size `size` moves with k ranks (peer_bench.py's rounding)."""
    total = size // 4
    return 4 * {"allgather": total // k * k, "reducescatter": total // k * k}.get(op, total)


class Bench:
    def __init__(self, a):
        self.a, self.k = a, a.hosts
        self.cpus = sorted(os.sched_getaffinity(0))
        self.tmp = tempfile.mkdtemp(prefix="ampccl-cmp-hosts-")
        atexit.register(shutil.rmtree, self.tmp, ignore_errors=True)
        self.base = ([hosts_exe()] + (["--rate", a.rate] if a.rate else [])
                     + (["--tcp-cc", a.tcp_cc] if a.tcp_cc else [])
                     + (["--quickack"] if a.quickack else []))

    def hosts(self, program):
        return self.base + ["-k", str(self.k), "--"] + program

    def csv_rows(self, text, op):
        """Rows of an ampccl-perf/peer_bench CSV text matching the peers' calls, in order."""
        if HEADER not in text:
            raise Failed("no CSV header in the output\n" + tail(text, ""))
        body = text[text.index(HEADER):]
        return [r for r in csv.DictReader(io.StringIO(body)) if r["placement"] == placement(op)]

    # --- the variants: each returns {size: (time_us, wrong or None)} ---

    def pinned(self, prog):
        """`prog` under `taskset -c RANK%CPUS` in each host with --pin-ampccl (ampccl's ranks and
        fabtests', the other libfabric program, alike), else as it is."""
        if not self.a.pin_ampccl:
            return prog
        ncpu = len(self.cpus)
        return ["sh", "-c", f'exec taskset -c "$(( $RANK % {ncpu} ))" "$@"', "pin"] + prog

    def ampccl(self, op, sizes, env=None):
        res = {}
        for s in sizes:
            n, w = iterations(s)
            if op == "pingpong":
                # Timed over as many round trips as fi_rdm_pingpong's, after a tenth of that.
                n = fab_iterations(s)
                w = max(w, n // 10)
            out = os.path.join(self.tmp, "ampccl.csv")
            prog = [perf_exe(), "-o", op, "-b", str(s), "-e", str(s), "-n", str(n), "-w", str(w),
                    "--csv", out]
            launch(self.hosts(self.pinned(prog)), dict(os.environ, **(env or {})), self.a.timeout)
            with open(out) as f:
                rows = self.csv_rows(f.read(), op)
            os.remove(out)
            row = max(rows, key=lambda r: int(r["bytes"]))
            res[s] = (float(row["time_us"]), int(row["wrong"]))
        return res

    def peer_bench(self, backend, op, sizes, prog, env):
        text = launch(self.hosts(prog + [PEER_BENCH, "--backend", backend, "--op", op,
                                         "--sizes", ",".join(map(str, sizes))]),
                      env, self.a.timeout)
        rows = self.csv_rows(text, op)
        if len(rows) != len(sizes):
            raise Failed(f"{len(rows)} rows for {len(sizes)} sizes\n" + tail(text, ""))
        return {s: (float(r["time_us"]), int(r["wrong"])) for s, r in zip(sizes, rows)}

    def gloo(self, op, sizes):
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        return self.peer_bench("gloo", op, sizes, [f"{PEERS_HOME}/torch/bin/python"], env)

    def ompi(self, op, sizes, yield_when_idle=False):
        o = f"{PEERS_HOME}/ompi"
        env = dict(os.environ, PATH=f"{o}/bin:" + os.environ["PATH"], OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        prog = RANK0 + [f"{o}/bin/mpirun", "--prtemca", "plm_ssh_agent", HOSTS_SSH,
                        "--host", ",".join(addr(i) for i in range(self.k)), "-n", str(self.k)]
        if self.a.mpi_pin == "per-host":
            rankfile = os.path.join(self.tmp, "rankfile")
            with open(rankfile, "w") as f:
                f.writelines(f"rank {r}={addr(r)} slot={r % len(self.cpus)}\n" for r in range(self.k))
            prog += ["--map-by", f"rankfile:file={rankfile}"]
        else:
            prog += ["--map-by", "node"]
        prog += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET,
                 "--mca", "oob_tcp_if_include", SUBNET]
        if yield_when_idle:
            prog += ["--mca", "mpi_yield_when_idle", "1"]
        return self.peer_bench("mpi", op, sizes, prog + [f"{o}/bin/python"], env)

    def impi(self, op, sizes):
        i = f"{PEERS_HOME}/impi"
        env = dict(os.environ, I_MPI_ROOT=i, PATH=f"{i}/bin:" + os.environ["PATH"],
                   LD_LIBRARY_PATH=f"{i}/lib", FI_PROVIDER="tcp", FI_TCP_IFACE="eth0",
                   I_MPI_HYDRA_IFACE="eth0", I_MPI_HYDRA_BOOTSTRAP="ssh",
                   I_MPI_HYDRA_BOOTSTRAP_EXEC=HOSTS_SSH)
        res = {}
        for s in sizes:
            n, _ = iterations(s)
            msg = effective(op, s, self.k) // (self.k if op == "allgather" else 1)
            # IMB's -msgsize stops at its default 4 MiB bound; -msglog lifts the bound.
            log = (msg - 1).bit_length()
            size_args = (["-msglog", f"{log}:{log}"] if msg > 4 << 20 else []) + ["-msgsize", str(msg)]
            imb = ["IMB-MPI1", IMB[op], "-npmin", str(self.k), *size_args, "-iter", str(n),
                   "-iter_policy", "off", "-time", "100000"]
            prog = RANK0 + ["mpirun"]
            for r in range(self.k):
                pin = (["-env", "I_MPI_PIN_PROCESSOR_LIST", str(self.cpus[r % len(self.cpus)])]
                       if self.a.mpi_pin == "per-host" else [])
                prog += ([":"] if r else []) + ["-n", "1", "-host", addr(r)] + pin + imb
            text = launch(self.hosts(prog), env, self.a.timeout)
            # PingPong rows: bytes, repetitions, t (half the round trip), MB/s; the others':
            # bytes, repetitions, t_min, t_max, t_avg[, MB/s].
            cols, t_col = ((4,), 2) if op == "pingpong" else ((5, 6), 3)
            got = [f for f in (l.split() for l in text.splitlines())
                   if len(f) in cols and f[0].isdigit() and int(f[0]) == msg]
            if not got:
                raise Failed(f"no IMB row for {msg} B\n" + tail(text, ""))
            res[s] = (float(got[-1][t_col]), None)  # t_max (us), see the module docs
        return res

    def fabtests(self, v, sizes):
        """{(test, size): (usec/xfer, GB/s)} of one round of fabtests variant v."""
        bindir, prov, env = FABTESTS[v]
        env = dict(os.environ, **env)
        env.pop("FI_PROVIDER", None)
        out = os.path.join(self.tmp, "fab.out")
        res = {}
        for test, (prog, *args) in FAB_TESTS.items():
            for s in sizes:
                n = fab_iterations(s)
                if prog == "fi_rma_bw":
                    w = max(1, min(64, (128 << 20) // max(s, 1)))
                    args_s = args + ["-W", str(w)]
                    n = max(n, 2 * w)
                else:
                    args_s = args
                cmd = [os.path.join(bindir, prog), "-p", prov, "-e", "rdm", "-m", "-S",
                       fab_size(test, s), "-I", str(n)] + args_s
                for side in (0, 1):
                    if os.path.exists(f"{out}.{side}"):
                        os.remove(f"{out}.{side}")
                try:
                    launch(self.base + ["-k", "2", "--", "sh", "-c", FAB_SH, "fab", out] + self.pinned(cmd),
                           env, self.a.timeout)
                    sides = []
                    for side in (0, 1):
                        with open(f"{out}.{side}") as f:
                            text = f.read()
                        sides += [(float(m.group(2)), float(m.group(1)) / 1e3) for m in re.finditer(
                            r"xfer_size: %d,.*MB/sec: ([\d.]+), usec/xfer: ([\d.]+)" % s, text)]
                except (Failed, OSError) as e:
                    tails = ""
                    for side in (0, 1):
                        if os.path.exists(f"{out}.{side}"):
                            with open(f"{out}.{side}") as f:
                                tails += f"  host {side}:\n" + tail(f.read(), "", 6) + "\n"
                    raise Failed(f"{prog} {' '.join(args_s)} -S {s}: {e}\n{tails}")
                if not sides:
                    raise Failed(f"{prog} {' '.join(args_s)} -S {s}: no figures in its output")
                res[(test, s)] = max(sides)  # the slower side
        return res

    def iperf3(self):
        """{ceiling: GB/s} of one round."""
        res = {}
        for name, args in IPERF.items():
            text = launch(self.base + ["--iperf3", args.format(t=self.a.iperf3_time)],
                          dict(os.environ), self.a.timeout)
            recv = [l for l in text.splitlines() if l.rstrip().endswith("receiver")]
            pick = {"single": [("single", lambda l: "[SUM]" not in l)],
                    "P4": [("P4", lambda l: "[SUM]" in l)],
                    "bidir": [("bidir 1->0", lambda l: "TX-C" in l and "[SUM]" not in l),
                              ("bidir 0->1", lambda l: "RX-C" in l and "[SUM]" not in l)]}[name]
            for key, match in pick:
                lines = [l for l in recv if match(l)]
                m = re.search(r"([\d.]+) ([KMG]?)bits/sec", lines[0]) if lines else None
                if not m:
                    raise Failed(f"iperf3 {args}: no receiver rate\n" + tail(text, ""))
                res[key] = float(m.group(1)) * {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0}[m.group(2)] / 8
        return res


def installed(v):
    """None if variant v can run here, else what is missing."""
    need = {"ampccl": [hosts_exe(), perf_exe()],
            "ampccl-ofi": [hosts_exe(), perf_exe()],
            "ampccl-ofi2": [hosts_exe(), perf_exe(), f"{IMPI_LIB}/libfabric.so.1"],
            "fabtests": [hosts_exe()] + [f"{FABTESTS['fabtests'][0]}/{p}" for p in ("fi_rma_bw", "fi_rdm_pingpong")],
            "fabtests2": [hosts_exe(), f"{IMPI_LIB}/libfabric.so.1"]
                         + [f"{FABTESTS['fabtests2'][0]}/{p}" for p in ("fi_rma_bw", "fi_rdm_pingpong")],
            "gloo": [f"{PEERS_HOME}/torch/bin/python"],
            "impi": [f"{PEERS_HOME}/impi/bin/mpirun", f"{PEERS_HOME}/impi/bin/IMB-MPI1"],
            "ompi": [f"{PEERS_HOME}/ompi/bin/mpirun", f"{PEERS_HOME}/ompi/bin/python"],
            "ompi-yield": [f"{PEERS_HOME}/ompi/bin/mpirun", f"{PEERS_HOME}/ompi/bin/python"],
            "iperf3": [shutil.which("iperf3") or "iperf3 (on PATH)"]}[v]
    missing = [p for p in need if not os.access(p, os.R_OK if ".so" in p else os.X_OK)]
    return ", ".join(missing) or None


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=2, help="emulated hosts, one rank each")
    ap.add_argument("--op", default="allreduce", help=f"comma-separated: {', '.join(OPS)}")
    ap.add_argument("--sizes", default="8,1M,16M,64M", help="comma-separated, K/M/G suffixes")
    ap.add_argument("--peers", default="ampccl,iperf3,gloo,impi,ompi",
                    help="comma-separated, in run order: ampccl, ampccl-ofi, ampccl-ofi2, iperf3, fabtests "
                         "(libfabric 1.17), fabtests2 (libfabric 2.4), gloo, impi, ompi (both "
                         "Open MPI variants), ompi-default, ompi-yield")
    ap.add_argument("--rate", help="shape every host's link with tc tbf (e.g. 5gbit)")
    ap.add_argument("--tcp-cc", help="every host's TCP congestion control (e.g. cubic; default: this "
                                     "machine's, which the hosts inherit)")
    ap.add_argument("--quickack", action="store_true",
                    help="every host acknowledges each TCP segment at once (a route metric)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--iperf3-time", type=float, default=3, help="seconds per iperf3 test")
    ap.add_argument("--pin-ampccl", action="store_true",
                    help="run each ampccl rank, and each fabtests side, under taskset -c RANK%%CPUS, "
                         "as the MPI peers are pinned")
    ap.add_argument("--mpi-pin", choices=["per-host", "default"], default="per-host",
                    help="per-host: each MPI rank (all its threads) on CPU RANK%%CPUS, as on "
                         "separate machines; default: the launchers' own binding, which puts "
                         "every host's rank on CPU 0 (see the docstring)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    ap.add_argument("--wait-quiet", type=int, default=600,
                    help="before each round, wait up to this many seconds for builds to end")
    ap.add_argument("--no-probe", action="store_true", help="do not probe the host for slow spells")
    ap.add_argument("--wait-spell", type=int, default=600,
                    help="before each launch, wait up to this many seconds for a slow spell to end")
    ap.add_argument("--spell-tries", type=int, default=3,
                    help="runs of a launch that slow spells keep beginning during, at most (then it is "
                         "left out of the round)")
    a = ap.parse_args()

    ops = a.op.split(",")
    if bad := [o for o in ops if o not in OPS]:
        sys.exit(f"unknown ops {bad}; known: {', '.join(OPS)}")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    order = []
    for p in a.peers.split(","):
        expand = {"ompi": ["ompi", "ompi-yield"], "ompi-default": ["ompi"]}.get(p, [p])
        for v in expand:
            if v not in VARIANTS + CEILING_PEERS:
                sys.exit(f"unknown peer {p}; known: ampccl, ampccl-ofi, ampccl-ofi2, iperf3, fabtests, "
                         "fabtests2, gloo, impi, ompi, ompi-default, ompi-yield")
            if v not in order:
                order.append(v)
    for v in list(order):
        if (missing := installed(v)):
            print(f"skipping {v}: not installed ({missing}; see benches/peers/install.sh)", file=sys.stderr)
            order.remove(v)
    if not order:
        sys.exit("nothing to run")
    variants = [v for v in order if v not in CEILING_PEERS]
    fabs = [v for v in order if v in FABTESTS]
    for op in ops:
        for v in variants:
            if op in LACKS.get(v, ()):
                print(f"skipping {v} for {op}: it has no {op}", file=sys.stderr)
    b = Bench(a)
    runners = {"ampccl": b.ampccl, "ampccl-ofi": lambda op, s: b.ampccl(op, s, OFI_ENV),
               "ampccl-ofi2": lambda op, s: b.ampccl(op, s, OFI2_ENV),
               "gloo": b.gloo, "impi": b.impi, "ompi": b.ompi,
               "ompi-yield": lambda op, s: b.ompi(op, s, yield_when_idle=True)}
    os.makedirs(a.out_dir, exist_ok=True)
    # times[(op, v)][size] = [us per round]; ceil[name] = [GB/s per round]
    times = {(op, v): {s: [] for s in sizes} for op in ops for v in variants}
    wrong = {(op, v): {} for op in ops for v in variants}
    ceil = {c: [] for c in CEILINGS}
    # fab[(v, test, size)] = [(usec/xfer, GB/s) per round]
    fab = {(v, t, s): [] for v in fabs for t in FAB_TESTS for s in sizes}
    raw = open(os.path.join(a.out_dir, "rounds.csv"), "w")
    raw.write("round,op,variant,size,bytes,time_us,gbs,wrong\n")
    probe = None if a.no_probe else HostProbe()
    tally = {"spells": 0, "redone": 0, "dropped": 0, "failures": 0}

    def guarded(label, job):
        """job()'s result, run outside the host's slow spells (see the module docs): waits for
        a spell to end first and runs it again when one began meanwhile; None when it failed
        or every run met a spell."""
        for attempt in range(1, a.spell_tries + 1):
            if probe and (t := probe.us()) > SPELL_US:
                print(f"{label}: host probe {t:.1f} us (a slow spell), waiting up to {a.wait_spell} s",
                      file=sys.stderr)
                probe.wait_normal(a.wait_spell)
            t0 = time.time()
            try:
                res = job()
            except Failed as e:
                tally["failures"] += 1
                print(f"{label} FAILED: {e}", file=sys.stderr)
                return None
            print(f"{label} ({time.time() - t0:.1f} s)", file=sys.stderr)
            if not probe or (t := probe.us()) <= SPELL_US:
                return res
            tally["spells"] += 1
            again = attempt < a.spell_tries
            tally["redone" if again else "dropped"] += 1
            print(f"{label}: host probe {t:.1f} us after it: a slow spell began, "
                  + ("run again" if again else "left out of this round"), file=sys.stderr)
        return None

    noisy = 0
    i = 0
    while i < a.rounds:
        if a.wait_quiet and builders():
            print(f"round {i + 1}/{a.rounds}: builds running, waiting up to {a.wait_quiet} s", file=sys.stderr)
        busy = wait_quiet(a.wait_quiet)
        print(f"round {i + 1}/{a.rounds}: load {os.getloadavg()[0]:.2f}, builds running: {busy or 'none'}",
              file=sys.stderr)
        got, got_ceil, got_fab = {}, {}, {}
        for op in ops:
            for v in order:
                if v in CEILING_PEERS:
                    if op != ops[0]:
                        continue
                    what = v
                elif op in LACKS.get(v, ()):
                    continue
                else:
                    what = f"{TITLES[v]} {op}"
                if v == "iperf3":
                    got_ceil.update(guarded(f"round {i + 1}/{a.rounds}: {what}", b.iperf3) or {})
                    continue
                for s in sizes:
                    if v not in FABTESTS and effective(op, s, a.hosts) == 0:
                        continue
                    label = f"round {i + 1}/{a.rounds}: {what} {s} B"
                    if v in FABTESTS:
                        got_fab.setdefault(v, {}).update(guarded(label, lambda: b.fabtests(v, [s])) or {})
                    else:
                        got.setdefault((op, v), {}).update(guarded(label, lambda: runners[v](op, [s])) or {})
        for (op, v), res in got.items():
            for s, (t, w) in res.items():
                times[(op, v)][s].append(t)
                if w is not None:
                    wrong[(op, v)][s] = wrong[(op, v)].get(s, 0) + w
                raw.write(f"{i + 1},{op},{v},{s},{effective(op, s, a.hosts)},{t:.3f},,"
                          f"{'' if w is None else w}\n")
        for c, g in got_ceil.items():
            ceil[c].append(g)
            raw.write(f"{i + 1},iperf3,{c},,,,{g:.4f},\n")
        for v, res in got_fab.items():
            for (t, s), (us, g) in res.items():
                fab[(v, t, s)].append((us, g))
                raw.write(f"{i + 1},fabtests,{v} {t},{s},{s},{us:.3f},{g:.4f},\n")
        raw.flush()
        noisy += bool(busy or builders())
        i += 1
    raw.close()

    def med(xs):
        return statistics.median(xs) if xs else None

    k = a.hosts
    summary = open(os.path.join(a.out_dir, "compare_hosts.csv"), "w")
    summary.write("op,hosts,variant,size,bytes,rounds,time_us,algbw_gbs,busbw_gbs,wrong\n")
    c_med = {c: med(ceil[c]) for c in CEILINGS}
    f_med = {key: (med([x[0] for x in xs]), med([x[1] for x in xs])) for key, xs in fab.items()}
    print(f"{k} hosts x 1 rank, f32, medians of {a.rounds} alternated rounds"
          + (f", links shaped to {a.rate}" if a.rate else "")
          + f", TCP congestion control {a.tcp_cc or 'the machine default'}"
          + (", every segment acknowledged at once (quickack)" if a.quickack else "")
          + f"; time per call (us), algbw (GB/s = 1e9 B/s); builds ran during {noisy} round(s)"
          + (f"; a slow spell of the host began during {tally['spells']} launch(es): {tally['redone']} run "
             f"again, {tally['dropped']} left out" if probe else "; host not probed")
          + (f"; {tally['failures']} launch(es) failed (see stderr)" if tally["failures"] else "") + "\n")
    for op in ops:
        variants = [v for v in order if v not in CEILING_PEERS and op not in LACKS.get(v, ())]
        m = {v: {s: med(times[(op, v)][s]) for s in sizes} for v in variants}
        n_of = {v: {s: len(times[(op, v)][s]) for s in sizes} for v in variants}
        for v in variants:
            with open(os.path.join(a.out_dir, f"{op}-{NAMES[v]}.csv"), "w") as f:
                f.write(HEADER + "\n")
                redop = "none" if op in ("allgather", "broadcast") + PAIRED else "sum"
                root = 0 if op == "broadcast" else -1
                for s in sizes:
                    t, nb = m[v][s], effective(op, s, k)
                    w = wrong[(op, v)].get(s) if v not in ("impi",) else None
                    alg = nb / t / 1e3 if t else None
                    summary.write(f"{op},{k},{v},{s},{nb},{n_of[v][s]},{fmt(t, '.3f')},{fmt(alg, '.4f')},"
                                  f"{fmt(alg and alg * BUS[op](k), '.4f')},{'' if w is None else w}\n"
                                  .replace("—", ""))
                    if t:
                        f.write(f"{op},{k},{nb},{nb // 4},float,{redop},{root},{placement(op)},{t:.3f},"
                                f"{alg:.4f},{alg * BUS[op](k):.4f},{w or 0}\n")
        if not variants:
            continue
        peers = [v for v in variants if not v.startswith("ampccl")]
        head = ["size"]
        for v in variants:
            head += [f"{TITLES[v]} us", f"{TITLES[v]} GB/s"]
        if "ampccl" in variants and peers:
            head.append("best peer / ampccl")
        if "ampccl" in variants and c_med["single"]:
            head.append("ampccl / iperf3 1 stream")
        bounds = [(v, f) for v, f in FAB_OF.items() if v in variants and f in fabs]
        # Against fi_rma_bw -o write's rate, or fi_rdm_pingpong's time (x its time).
        fab_tests = ("pingpong", "pingpong-mixed", "pingpong-fd") if op == "pingpong" else ("write",)
        head += [f"{v} / {f} {t}" for v, f in bounds for t in fab_tests]
        print(f"### {op}, {k} hosts\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for s in sizes:
            nb = effective(op, s, k)
            if nb == 0:
                continue
            cells = [str(s) if nb == s else f"{s} ({nb} B)"]
            for v in variants:
                t = m[v][s]
                short = f" ({n_of[v][s]}/{a.rounds})" if t and n_of[v][s] < a.rounds else ""
                cells += [fmt(t, ".2f") + short, fmt(t and nb / t / 1e3, ".3f")]
            if "ampccl" in variants and peers:
                best = [m[p][s] for p in peers if m[p][s]]
                cells.append(f"{min(best) / m['ampccl'][s]:.2f}x" if best and m["ampccl"][s] else "—")
            if "ampccl" in variants and c_med["single"]:
                t = m["ampccl"][s]
                cells.append(f"{nb / t / 1e3 / c_med['single']:.2f}" if t else "—")
            for (v, f), ft in ((b, ft) for b in bounds for ft in fab_tests):
                t, (us, g) = m[v][s], f_med[(f, ft, s)]
                if op == "pingpong":
                    cells.append(f"{t / us:.2f}x" if t and us else "—")
                else:
                    cells.append(f"{nb / t / 1e3 / g:.2f}" if t and g else "—")
            print("| " + " | ".join(cells) + " |")
        print()
    summary.close()
    if "iperf3" in order:
        with open(os.path.join(a.out_dir, "ceilings.csv"), "w") as f:
            f.write("variant,rounds,gbs\n")
            for c in CEILINGS:
                f.write(f"{c},{len(ceil[c])},{fmt(c_med[c], '.4f').replace('—', '')}\n")
        print(f"### network ceiling (iperf3 -t {a.iperf3_time:g}, host 1 -> host 0 unless said), GB/s per direction\n")
        print("| " + " | ".join(CEIL_TITLES[c] for c in CEILINGS) + " |")
        print("|" + "---:|" * len(CEILINGS))
        print("| " + " | ".join(fmt(c_med[c], ".3f") for c in CEILINGS) + " |")
    if fabs:
        with open(os.path.join(a.out_dir, "fabtests.csv"), "w") as f:
            f.write("variant,test,size,bytes,rounds,usec_xfer,gbs\n")
            for (v, t, s), (us, g) in f_med.items():
                f.write(f"{v},{t},{s},{s},{len(fab[(v, t, s)])},{fmt(us, '.3f')},{fmt(g, '.4f')}\n"
                        .replace("—", ""))
        print("\n### libfabric ceiling (fabtests, host 1 <-> host 0): fi_rma_bw write (both "
              "directions at once) and writedata (1 -> 0), GB/s per direction; fi_rdm_pingpong, "
              "us (half round trip)\n")
        head = ["size"] + [f"{v} {t} {'us' if t.startswith('pingpong') else 'GB/s'}"
                           for v in fabs for t in FAB_TESTS]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for s in sizes:
            cells = [str(s)]
            for v in fabs:
                for t in FAB_TESTS:
                    us, g = f_med[(v, t, s)]
                    n = len(fab[(v, t, s)])
                    short = f" ({n}/{a.rounds})" if n and n < a.rounds else ""
                    cells.append((fmt(us, ".2f") if t.startswith("pingpong") else fmt(g, ".3f")) + short)
            print("| " + " | ".join(cells) + " |")
    bad = {f"{op} {v}": w for (op, v), w in wrong.items() if any(w.values())}
    if bad:
        print(f"\nWRONG RESULTS: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
