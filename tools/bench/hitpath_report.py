#!/usr/bin/env python3
"""hitpath_report.py CSV... - the hit path's table from ipcbench runs (make bench, part hitpath).

Medians over the runs given of each row's median per pair and aggregate pairs/s, per API:
threads 1/2/4/8/16 on one handle ("same") and on a handle each ("different"), A1 and A2
(no cache: the driver's own refcounted pair, one reference held) beside B (cache hits);
then, for the runtime API, cudart's pair beside the driver's entry point called directly,
the driver's floor with threads and, pinned (ipcbench --pin), the threads against the same
CPUs each alone; and the issue's targets checked against the driver API's figures.
"""
import csv
import statistics
import sys
from collections import defaultdict


def load(paths):
    acc = defaultdict(list)
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["api"], r["cudart"], r["mode"], int(r["threads"]), r["pass"])
                acc[key].append((float(r["median_ns"]), float(r["pairs_per_s"])))
    return {k: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs), len(vs))
            for k, vs in acc.items()}


def ns(v):
    return "-" if v is None else (f"{v / 1000:.2f} us" if v >= 1000 else f"{v:.0f} ns")


def solo_cores(get, api, rt, mode="shim_hit_pair"):
    """One thread alone on each CPU (ipcbench --pin): [(median ns, pairs/s)] by CPU."""
    out = []
    while (r := get(api, rt, f"{mode}_solo_cpu{len(out)}", 1, "B")):
        out.append(r)
    return out


def against_alone(get, api, rt, n, solo, modes):
    """n threads' aggregate over the sum of their n CPUs' pairs/s alone, per mode."""
    alone = sum(r[1] for r in solo[:n])
    parts = []
    for kind, mode in modes:
        b = get(api, rt, mode, n, "B")
        if b:
            parts.append(f"{kind} {n * b[1] / alone:.1f}x")
    return parts


def scaling_lines(get, api, rt, threads):
    """The floor with threads, and the threads against the same cores alone."""
    lines = []
    floor = [(n, get(api, rt, f"context_pair_{n}threads", n, "B")) for n in threads]
    floor = [(n, f) for n, f in floor if f]
    if floor:
        one = floor[0][1][1]
        lines.append("The driver's two cuCtxGetId(NULL) alone (the floor), per pair and aggregate: " +
                     ", ".join(f"{n} thread(s) {ns(f[0])} ({f[1] / one:.1f}x)" for n, f in floor) + ".")
    solo = solo_cores(get, api, rt)
    if solo:
        med = sorted(r[0] for r in solo)
        lines.append(f"Pinned, one thread alone on each of {len(solo)} CPUs: {ns(statistics.median(med))} "
                     f"median, {ns(med[0])}-{ns(med[-1])}.")
        floor_solo = solo_cores(get, api, rt, "context_pair")
        for n in threads:
            if n < 2 or n > len(solo):
                continue
            parts = against_alone(get, api, rt, n, solo, (
                ("hits on one handle", f"shim_hit_pair_{n}threads"),
                ("on a handle each", f"shim_hit_pair_distinct_{n}threads")))
            if len(floor_solo) >= n:
                parts += against_alone(get, api, rt, n, floor_solo, (
                    ("the driver's floor", f"context_pair_{n}threads"),))
            if parts:
                lines.append(f"{n} threads against their {n} CPUs alone ({n}x if nothing is shared): " +
                             ", ".join(parts) + ".")
    return lines


def main(paths):
    rows = load(paths)
    get = lambda api, rt, mode, n, p: rows.get((api, rt, mode, n, p))
    variants = sorted({(k[0], k[1]) for k in rows})
    threads = sorted({k[3] for k in rows if k[2].endswith("threads")})
    targets = []
    for api, rt in variants:
        print(f"\n### {api} API (cudart {rt}), median per pair; B's aggregate pairs/s and its ratio to one thread\n")
        print("| threads | same: A1 held | B hit | A2 held | B M pairs/s | different: A1 held | B hit | A2 held | B M pairs/s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        one = {}
        for n in threads:
            cells = [str(n)]
            for kind, held, hit in (("same", f"held_pair_{n}threads", f"shim_hit_pair_{n}threads"),
                                    ("different", f"held_pair_distinct_{n}threads",
                                     f"shim_hit_pair_distinct_{n}threads")):
                a1, b, a2 = (get(api, rt, held, n, "A1"), get(api, rt, hit, n, "B"), get(api, rt, held, n, "A2"))
                cells += [ns(a1 and a1[0]), ns(b and b[0]), ns(a2 and a2[0])]
                if b:
                    one.setdefault(kind, b[1])
                    cells.append(f"{b[1] / 1e6:.2f} ({b[1] / one[kind]:.1f}x)")
                    if api == "driver" and n == 8:
                        need = 4 if kind == "same" else 7
                        targets.append(f"8 threads, {kind} handle(s): {b[1] / one[kind]:.1f}x one thread "
                                       f"(target >= {need}x): {'met' if b[1] / one[kind] >= need else 'NOT met'}")
                else:
                    cells.append("-")
            print("| " + " | ".join(cells) + " |")
        single = get(api, rt, "shim_hit_pair", 1, "B")
        if api == "driver" and single:
            targets.insert(0, f"one thread, driver API hit pair: {ns(single[0])} (target <= 60 ns): "
                              f"{'met' if single[0] <= 60 else 'NOT met'}")
        entry = get(api, rt, "shim_hit_pair_entry", 1, "B")
        if single and entry:
            held, held_entry = get(api, rt, "held_pair", 1, "A1"), get(api, rt, "held_pair_entry", 1, "A1")
            print(f"\nOne thread, B: cudart hit pair {ns(single[0])}, the same pair through the driver's entry "
                  f"point {ns(entry[0])}: cudart's own cost {ns(single[0] - entry[0])} per pair"
                  + (f"; A1 held pair {ns(held[0])} through cudart, {ns(held_entry[0])} through the entry point"
                     if held and held_entry else "") + ".")
        elif single:
            context = get(api, rt, "context_pair", 1, "B")
            current = get(api, rt, "current_pair", 1, "B")
            print(f"\nOne thread, B, single-pair mode (64 pairs per clock reading): {ns(single[0])}"
                  + (f"; of which the driver's two cuCtxGetId(NULL) (one per call): {ns(context[0])}"
                     if context else "")
                  + (f" (two cuCtxGetCurrent: {ns(current[0])})" if current else "") + ".")
        for line in scaling_lines(get, api, rt, threads):
            print(f"\n{line}")
    if targets:
        print("\nTargets (issue 21):\n")
        for t in targets:
            print(f"- {t}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: hitpath_report.py CSV...")
    main(sys.argv[1:])
