#!/usr/bin/env python3
"""Reads the files benches/scripts/syscall_timeline.c wrote (one per process) and prints either
the merged timeline of a window, one column per process, or per-process sums.

    syscall_timeline.py timeline PREFIX [--at 0.66] [--us 1200]
        the calls that start within --us microseconds from --at (a fraction of the run):
        time from the window's start, thread, call, its duration and result
    syscall_timeline.py sums PREFIX --per N [--min-bytes 8000]
        per process and call kind, of the calls that moved at least --min-bytes: count, time
        and bytes divided by N (the calls the run made, warm-up included), and their rate
    syscall_timeline.py gaps PREFIX
        per process, over the middle half of its calls (past set-up and warm-up): the median
        duration of each call kind that moved data or found something, and the median time
        from the end of a receive to the start of the next send (a ping-pong's turnaround
        in user space)

PREFIX is $SYSCALL_TIMELINE of the run (files PREFIX.<pid>); files of fewer than 2 KB
(launchers, shells) are skipped.
"""

import argparse
import glob
import os
import signal
import statistics
from collections import defaultdict


def load(prefix):
    """{pid: [(start, end, tid, call, result)]} of every file of the run with content."""
    runs = {}
    for path in glob.glob(prefix + ".*"):
        if os.path.getsize(path) < 2048:
            continue
        pid = path.rsplit(".", 1)[1]
        with open(path) as f:
            runs[pid] = [(float(a), float(b), int(t), c, int(r))
                         for a, b, t, c, r in (line.split() for line in f)]
    return runs


def timeline(runs, at, span):
    calls = sorted((rec, pid) for pid, recs in runs.items() for rec in recs)
    if not calls:
        return
    first, last = calls[0][0][0], calls[-1][0][0]
    start = first + (last - first) * at
    pids = sorted(runs)
    for (t0, t1, tid, call, result), pid in calls:
        if start <= t0 < start + span:
            indent = " " * 44 * pids.index(pid)
            print(f"{t0 - start:9.1f} {indent}{tid % 1000:3d} {call} {t1 - t0:.0f}us -> {result}")


def sums(runs, per, min_bytes):
    """The data path only: calls that moved at least `min_bytes` (setup's blocking reads and
    the polls would swamp the sums otherwise)."""
    for pid, recs in sorted(runs.items()):
        kinds = defaultdict(lambda: [0, 0.0, 0])
        for t0, t1, _tid, call, result in recs:
            if call not in ("epoll_wait", "poll") and result >= min_bytes:
                k = kinds[call]
                k[0] += 1
                k[1] += t1 - t0
                k[2] += result
        cells = [f"{c} {n / per:.1f}x {t / per:.1f}us {b / per / 1024:.0f}KiB "
                 f"({b / t / 1e3:.1f} GB/s)" for c, (n, t, b) in sorted(kinds.items())]
        print(f"{pid}: " + (", ".join(cells) or "no call moved that much"))


def gaps(runs):
    """Per process: median call durations and the median receive-to-send turnaround."""
    for pid, recs in sorted(runs.items()):
        mid = recs[len(recs) // 4: 3 * len(recs) // 4]
        took, turn, received = defaultdict(list), [], None
        for t0, t1, _tid, call, result in mid:
            if result <= 0:
                continue
            took[call].append(t1 - t0)
            if call in ("recv", "recvfrom", "recvmsg", "readv"):
                received = t1
            elif call in ("send", "sendmsg", "sendto", "writev") and received is not None:
                turn.append(t0 - received)
                received = None
        cells = [f"{c} {len(v)}x {statistics.median(v):.2f}us" for c, v in sorted(took.items())]
        gap = f"{statistics.median(turn):.2f}us" if turn else "none"
        print(f"{pid}: receive to send {gap}; " + ", ".join(cells))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("timeline", "sums", "gaps"))
    ap.add_argument("prefix")
    ap.add_argument("--at", type=float, default=0.66)
    ap.add_argument("--us", type=float, default=1200)
    ap.add_argument("--per", type=int, default=1)
    ap.add_argument("--min-bytes", type=int, default=8000)
    a = ap.parse_args()
    runs = load(a.prefix)
    if a.mode == "timeline":
        timeline(runs, a.at, a.us)
    elif a.mode == "gaps":
        gaps(runs)
    else:
        sums(runs, a.per, a.min_bytes)


if __name__ == "__main__":
    main()
