"""NCCL kernel durations and the idle gaps between them, per GPU, from an nsys SQLite export.

    python kernel_gaps.py trace.sqlite

Prints, per device: NCCL kernels, their median duration, the median gap from one NCCL kernel's
end to the next one's start, and the other kernels and copies that ran on that device.
"""
import sqlite3
import statistics
import sys

db = sqlite3.connect(sys.argv[1])
names = dict(db.execute("SELECT id, value FROM StringIds"))
rows = db.execute(
    "SELECT deviceId, start, end, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY deviceId, start"
).fetchall()
try:
    copies = dict(db.execute(
        "SELECT deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY deviceId"))
except sqlite3.Error:
    copies = {}
by_dev = {}
for dev, s, e, n in rows:
    by_dev.setdefault(dev, []).append((s, e, names.get(n, "?")))
for dev, ks in sorted(by_dev.items()):
    nccl = [(s, e) for s, e, n in ks if "nccl" in n.lower()]
    big = [(s, e) for s, e in nccl if e - s > 20_000]  # the 64 MiB calls, not barriers
    durs = [(e - s) / 1e3 for s, e in big]
    gaps = [(b[0] - a[1]) / 1e3 for a, b in zip(big, big[1:]) if b[0] - a[1] < 1e6]
    other = {}
    for s, e, n in ks:
        if "nccl" not in n.lower():
            other[n] = other.get(n, 0) + 1
    print(f"dev {dev}: {len(big)} NCCL kernels > 20 us, median {statistics.median(durs) if durs else 0:.1f} us, "
          f"median gap {statistics.median(gaps) if gaps else 0:.1f} us, p90 gap "
          f"{sorted(gaps)[int(len(gaps) * 0.9)] if gaps else 0:.1f} us; copies {copies.get(dev, 0)}; "
          f"other kernels {dict(sorted(other.items(), key=lambda x: -x[1])[:4])}")
