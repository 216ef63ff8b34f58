"""Side-by-side report of collectives.py outputs.

  compare.py check NCCL_PREFIX PRELOAD_PREFIX      bitwise/bound diff of check results
  compare.py bench NCCL.json PRELOAD.json [...]    busbw table and ratios (one column per file)
"""
import glob, json, sys


def check(a_prefix, b_prefix):
    a = {}
    for f in sorted(glob.glob(a_prefix + ".rank*.json")):
        d = json.load(open(f))
        for r in d["results"]:
            a[(d["rank"], r["name"])] = r
    bad = same = rounded = 0
    fails_b = 0
    for f in sorted(glob.glob(b_prefix + ".rank*.json")):
        d = json.load(open(f))
        for r in d["results"]:
            ref = a.get((d["rank"], r["name"]))
            if not r["ok"]:
                fails_b += 1
            if ref is None:
                continue
            if ref["digest"] == r["digest"]:
                same += 1
            elif "/rand/" in r["name"] and r["ok"]:
                rounded += 1  # floats summed in another order, within the stated bound
            else:
                bad += 1
                print(f"DIFF rank {d['rank']} {r['name']}")
    print(f"check: {same} bitwise equal to NCCL-only, {rounded} float results within the rounding bound, "
          f"{bad} differing, {fails_b} failing the reference")
    return 1 if bad or fails_b else 0


def bench(files):
    runs = [json.load(open(f)) for f in files]
    base = {(r["op"], r["bytes"]): r for r in runs[0]["rows"]}
    head = f"{'op':>13} {'bytes':>11} | {'NCCL busbw':>10}"
    for run in runs[1:]:
        head += f" | {str(run.get('alpha')).replace('ALPHA=', 'a=')[:10]:>10} {'ratio':>5}"
    print(head)
    for key, r0 in base.items():
        line = f"{key[0]:>13} {key[1]:>11} | {r0['busbw']:>10.1f}"
        for run in runs[1:]:
            r = next((x for x in run["rows"] if (x["op"], x["bytes"]) == key), None)
            line += f" | {r['busbw']:>10.1f} {r['busbw'] / r0['busbw']:>5.3f}" if r else " |" + " " * 17
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[2], sys.argv[3]) if sys.argv[1] == "check" else bench(sys.argv[2:]))
