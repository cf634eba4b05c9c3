#!/usr/bin/env python3
"""soak_verdict.py WITH [WITHOUT]

The stand-in soak's verdict (make soak): reads the run folders that
build/tests/soak wrote (importers.csv, machine.csv, summary.txt; WITH the run
with the library, WITHOUT the same fleet without it), prints the report and
exits 0 when every check passes, 1 when one fails.

The checks, for each run:
  - no wrong value and no return code that differs from the shadow model;
  - no importer that ended early, none at its soft limit of open files;
  - flat series: after the warm-up (the first quarter of the run, at least
    10 s: every exporter's weights synced once), the slope test of each importer's series against its own opens
    (legacy opens plus VMM imports), and of the machine's against the fleet's,
    is below its bound (the SERIES tables: growth per million opens). What
    only follows the fleet's working set is plotted, not judged: the
    exporters' lives draw how many allocations and bytes are alive at a
    time, so the library's entries and idle bytes and the driver's mapped
    bytes wander with or without the library (the run without it failed a
    slope on its own driver bytes, 2026-12-04); the caps bound them. What a
    leak would raise is judged: RSS and fds (their high-water), and by their
    floor the bytes the driver still maps for an importer of memory whose
    exporter freed it or died (ghost_bytes: a mapping in use keeps it until
    its close, a cached one must not), and the release ledger's importer
    slots; its exports listed must stay under the ledger's bound;
  - pinned bytes: what the stand-in's memory still holds after the last
    exporter's free (and the importers' helpers' second) is no more than
    the caps allow (the sum of the importers' IPCCACHE_MAX_IDLE_BYTES; 0
    without the library);
and, with the library, the fleet's hit rate over the second half of the
measured span within HIT_BAND points of the first half's (the rate per window
is printed: a few seconds' window of a short run swings with one exporter's
death or reset).

The slope test: the measured span is cut into WINDOWS windows; each gives a
point (opens at the window's end, the series' highest value in it, or its
lowest for a floor series); the least-squares line through them is the
growth. A high-water mark ignores the ups and downs of a bounded series (what
one second holds open) and follows a leak; a floor ignores what is held a
moment (memory freed while the program still maps it) and follows what is
never given back. A series passes when the line's whole rise over the span is below its
quantum (what a series moves by with the working set: it did not grow). A
leak follows events (misses, frees, exporters' deaths) more than opens, and
the fleet's opens are nearly all hits (millions a second), so a growth per
million opens would excuse one; it is printed, and only the process's RSS,
which counts the program's and the stand-in's heaps besides the library's
own memory (judged alone as mem_bytes), may pass by it instead.
"""
import argparse
import csv
import os
import sys

WINDOWS = 8
# A run measured for less is too short to tell a series' growth from its
# working set's swings (8 windows of under 8 s): its values, return codes and
# pinned bytes are judged, its series are not (the quick run's 24 s without
# the library; the soak's own tests lower it for their 14-s fleets).
MIN_SPAN = 60.0
HIT_BAND = 10.0  # percentage points
MIB = 1 << 20

# name: (columns, summed, those named "-column" subtracted (0 where empty:
# no library, or no stats line that second); bound per million opens or None
# (the rise alone decides), quantum, unit, "peak" or "floor")
IMPORTER_SERIES = {
    # RSS: the program's and the stand-in's heaps (glibc's arenas, which
    # fragment) besides the library's pages: 192-562 KiB over the 450 s after
    # the warm-up (2026-12-04, seed 2), under 64 KiB per million opens.
    "rss": (("rss_kib",), 64, 1024, "KiB", "peak"),
    # The library's own pages (its stats' mem_bytes): they grow to the most
    # its tables have needed, by regions of 1 MiB, still by up to one in the
    # first minutes after the warm-up (2026-12-04, 120-s runs, seeds 1-5); a
    # leak per miss or per free passes two regions within minutes.
    "mem_bytes": (("lib_mem_bytes",), None, 2 * MIB, "B", "peak"),
    # The fds that are not the dups the library keeps (its stats' vmm_fds,
    # bounded by an eighth of the soft limit: checked apart, see
    # judge_importers): those follow the VMM working set (exporters'
    # segments of up to 16 chunks coming and going; the floors of all fds
    # rose by 25 over the quick run's 90 s in a CI run of 2026-12-05). A
    # quantum of 32, judged on each window's floor: the fleet's own fds
    # (sockets, VMM fds in flight) move by up to 19 over a run without the
    # library too. An fd that leaks never closes, so it lifts the floors: a
    # planted fd per miss gives hundreds, a dup the library no longer counts
    # but never closed tens a minute.
    "fds": (("fds", "-lib_vmm_fds"), None, 32, "fds", "floor"),
    # Less than one exporter's pool (256 MiB): weights of 1-8 MiB may be
    # caught by the floor of one window while a sync holds them.
    "ghost_bytes": (("ghost_bytes",), None, 64 * MIB, "B", "floor"),
}
MACHINE_SERIES = {
    "ghost_bytes": (("ghost_bytes",), None, 64 * MIB, "B", "floor"),
    "ledger_importers": (("ledger_importers",), None, 2, "slots", "peak"),
}
# The exports listed follow the live exporters' allocations (the working
# set again: a rise of 210 in 30 s, seed 1, 12-04); what the library must
# hold is its bound.
LEDGER_EXPORTS_BOUND = 4096
# The dups the library keeps: at most the soft limit of open files over this
# (shim/vmm/vmm_fds.c).
KEPT_FDS_SHARE = 8
# With the library, what an importer maps of allocations freed or of a dead
# exporter beyond what the library counts in use there (its ghost_bytes: the
# program's own, as without it) is what the library keeps idle of them; its
# helper lets go within about a second (the 60-minute run of 2026-12-05: 5
# seconds in a row at most, the samples' one-second steps included). Longer
# is memory not given back (a missed record kept a dead exporter's pool 110 s).
IDLE_GHOST_SECONDS = 10


def longest_idle_ghost(rows):
    """The most seconds in a row the importer's rows (in time order) show idle
    ghost bytes, and when that run ended; (0, None) without the library."""
    best, start, end = 0.0, None, None
    for r in rows:
        if r.get("lib_ghost_bytes", "") == "":
            start = None
            continue
        t = float(r["t_s"])
        if float(r["ghost_bytes"] or 0) - float(r["lib_ghost_bytes"]) > 0:
            start = t if start is None else start
            if t - start > best:
                best, end = t - start, t
        else:
            start = None
    return best, end


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_summary(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            out[k] = float(v) if v.replace(".", "", 1).isdigit() else v
    return out


def value(row, cols):
    total = 0
    for c in cols:
        if c.startswith("-"):
            total -= float(row.get(c[1:], "") or 0)
        elif row.get(c, "") == "":
            return None
        else:
            total += float(row[c])
    return total


def fit(xs, ys):
    """Least-squares slope of ys against xs (0 when xs do not vary)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def slope_test(points, bound, quantum, mode="peak"):
    """points: (t, opens, value) after the warm-up, in time order. Returns
    (growth per million opens, rise over the span, passed)."""
    if len(points) < 2:
        return 0.0, 0.0, True
    t0, t1 = points[0][0], points[-1][0]
    width = (t1 - t0) / WINDOWS or 1
    windows = {}
    for t, x, y in points:
        k = min(int((t - t0) / width), WINDOWS - 1)
        cx, cy = windows.get(k, (x, y))
        windows[k] = (max(cx, x), min(cy, y) if mode == "floor" else max(cy, y))
    xs = [windows[k][0] for k in sorted(windows)]
    ys = [windows[k][1] for k in sorted(windows)]
    slope = fit(xs, ys)
    rise = slope * (xs[-1] - xs[0])
    growth = slope * 1e6
    return growth, rise, rise <= quantum or (bound is not None and growth <= bound)


class Verdict:
    def __init__(self):
        self.failures = []
        self.worst = (0.0, "none")

    def check(self, ok, what):
        if not ok:
            self.failures.append(what)

    def growth(self, label, growth, bound, rise, quantum, unit, ok):
        """The worst is the series whose rise is the largest part of its quantum."""
        said = "%s grows: rise %.3g %s over the span (quantum %g), %.3g per million opens" % (
            label, rise, unit, quantum, growth)
        if bound is not None:
            said += " (bound %g)" % bound
        ratio = rise / quantum if quantum else 0
        if ratio > self.worst[0]:
            self.worst = (ratio, said.replace(" grows:", ":", 1))
        self.check(ok, said)


def warm_up(summary):
    return max(10.0, summary["seconds"] / 4)


def judge_importers(rows, summary, v, label, series=True):
    warm, end = warm_up(summary), summary["seconds"]
    by_imp = {}
    for r in rows:
        by_imp.setdefault(r["importer"], []).append(r)
    for imp, rs in sorted(by_imp.items(), key=lambda kv: int(kv[0])):
        last = rs[-1]
        limit = int(last["fd_limit"] or 0)
        most = max(int(r["fds"] or 0) for r in rs)
        v.check(not limit or most < limit - 2,
                "%s importer %s reached its limit of open files (%d of %d)" % (label, imp, most, limit))
        idle, until = longest_idle_ghost(rs)
        v.check(idle <= IDLE_GHOST_SECONDS,
                "%s importer %s kept freed or dead exporters' memory idle for %.0f s in a row "
                "(until %.0f s; at most %d)" % (label, imp, idle, until or 0, IDLE_GHOST_SECONDS))
        kept = max(int(r.get("lib_vmm_fds", "") or 0) for r in rs)
        v.check(not limit or kept <= limit // KEPT_FDS_SHARE,
                "%s importer %s: the library kept %d fds, past an eighth of its limit of %d"
                % (label, imp, kept, limit))
        for name, (cols, bound, quantum, unit, mode) in (IMPORTER_SERIES.items() if series else ()):
            pts = [(float(r["t_s"]), float(r["opens"]) + float(r["imports"]), value(r, cols))
                   for r in rs if warm <= float(r["t_s"]) <= end]
            pts = [p for p in pts if p[2] is not None]
            if not pts:
                continue
            g, rise, ok = slope_test(pts, bound, quantum, mode)
            v.growth("%s importer %s %s" % (label, imp, name), g, bound, rise, quantum, unit, ok)


def judge_machine(rows, summary, v, label, series=True):
    warm, end = warm_up(summary), summary["seconds"]
    for name, (cols, bound, quantum, unit, mode) in (MACHINE_SERIES.items() if series else ()):
        pts = [(float(r["t_s"]), float(r["opens"]) + float(r["imports"]), value(r, cols))
               for r in rows if warm <= float(r["t_s"]) <= end]
        g, rise, ok = slope_test(pts, bound, quantum, mode)
        v.growth("%s machine %s" % (label, name), g, bound, rise, quantum, unit, ok)
    most = max((int(r["ledger_exports"]) for r in rows), default=0)
    v.check(most < LEDGER_EXPORTS_BOUND, "%s: the release ledger's exports reached its bound (%d of %d)"
            % (label, most, LEDGER_EXPORTS_BOUND))


def hit_totals(rows, summary):
    """The fleet's opens and hits (legacy and VMM imports) at each second after the warm-up."""
    warm, end = warm_up(summary), summary["seconds"]
    totals = {}
    for r in rows:
        t = float(r["t_s"])
        if r.get("lib_opens", "") == "" or not warm <= t <= end:
            continue
        o = float(r["lib_opens"]) + float(r["lib_vmm_imports"])
        h = float(r["lib_hits"]) + float(r["lib_vmm_import_hits"])
        ot, ht = totals.get(t, (0.0, 0.0))
        totals[t] = (ot + o, ht + h)
    return totals


def rate_between(totals, t0, t1):
    (o0, h0), (o1, h1) = totals[t0], totals[t1]
    return 100.0 * (h1 - h0) / (o1 - o0) if o1 > o0 else None


def hit_rates(totals):
    """The hit rate per window."""
    ts = sorted(totals)
    if len(ts) < 2:
        return []
    width = (ts[-1] - ts[0]) / WINDOWS or 1
    rates, start = [], ts[0]
    for k in range(WINDOWS):
        inside = [t for t in ts if start + k * width <= t <= start + (k + 1) * width]
        if len(inside) < 2:
            continue
        r = rate_between(totals, inside[0], inside[-1])
        if r is not None:
            rates.append(r)
    return rates


def hit_halves(totals):
    """The hit rate over the first and the second half of the span (None: too short)."""
    ts = sorted(totals)
    if len(ts) < 3:
        return None
    mid = ts[len(ts) // 2]
    first, second = rate_between(totals, ts[0], mid), rate_between(totals, mid, ts[-1])
    return None if first is None or second is None else (first, second)


def judge_run(folder, label, v, min_span=MIN_SPAN):
    s = read_summary(os.path.join(folder, "summary.txt"))
    imps = read_csv(os.path.join(folder, "importers.csv"))
    machine = read_csv(os.path.join(folder, "machine.csv"))
    v.check(s["wrong"] == 0, "%s: %d wrong values" % (label, s["wrong"]))
    v.check(s["rc_mismatch"] == 0, "%s: %d return codes differ from the model" % (label, s["rc_mismatch"]))
    v.check(s["importer_deaths"] == 0, "%s: %d importers ended early" % (label, s["importer_deaths"]))
    v.check(s["checks"] > 0, "%s: nothing was checked" % label)
    v.check(s["pinned_after_last_free"] <= s["caps_bytes"],
            "%s: %d bytes pinned after the last exporter's free (the caps allow %d)"
            % (label, s["pinned_after_last_free"], s["caps_bytes"]))
    span = s["seconds"] - warm_up(s)
    series = span >= min_span
    if not series:
        print("soak: %s: %.0f s measured, too short to judge its series (%g s)" % (label, span, min_span))
    judge_importers(imps, s, v, label, series)
    judge_machine(machine, s, v, label, series)
    totals = hit_totals(imps, s)
    rates, halves = hit_rates(totals), hit_halves(totals)
    if halves:
        v.check(abs(halves[1] - halves[0]) <= HIT_BAND,
                "%s: the hit rate left its band: %.1f %% in the second half against %.1f %% in the "
                "first (+- %g)" % (label, halves[1], halves[0], HIT_BAND))
    return s, rates, halves


def report(label, s, rates, halves):
    rate = (s["opens"] + s["imports"]) / s["seconds"] if s["seconds"] else 0
    print("soak: %s: %d s, %d exporters (%d started, %d killed), %d importers" %
          (label, s["seconds"], s["exporters"], s["exporter_starts"], s["exporter_kills"], s["importers"]))
    print("soak: %s: opens %d + VMM imports %d = %.0f/s sustained; %d checks, wrong values %d, "
          "return codes off the model %d" % (label, s["opens"], s["imports"], rate, s["checks"],
                                             s["wrong"], s["rc_mismatch"]))
    print("soak: %s: pinned after the last exporter's free: %d bytes (after %.1f s; caps allow %d)"
          % (label, s["pinned_after_last_free"], s["pinned_wait_s"], s["caps_bytes"]))
    if rates:
        print("soak: %s: hit rate per window: %s %%" % (label, " ".join("%.1f" % r for r in rates)))
    if halves:
        print("soak: %s: hit rate, first half / second half: %.1f / %.1f %%" % (label, halves[0], halves[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="WITH [WITHOUT]")
    ap.add_argument("--min-span", type=float, default=MIN_SPAN,
                    help="seconds measured after the warm-up below which series are not judged")
    a = ap.parse_args()
    v = Verdict()
    labels = ["with", "without"]
    for folder, label in zip(a.runs, labels):
        s, rates, halves = judge_run(folder, label, v, a.min_span)
        report(label, s, rates, halves)
    print("soak: worst growth: %s" % v.worst[1])
    for f in v.failures[:20]:
        print("soak: FAIL: %s" % f)
    if len(v.failures) > 20:
        print("soak: ... and %d more" % (len(v.failures) - 20))
    print("soak: verdict: %s" % ("pass" if not v.failures else "FAIL (%d)" % len(v.failures)))
    return 0 if not v.failures else 1


if __name__ == "__main__":
    sys.exit(main())
