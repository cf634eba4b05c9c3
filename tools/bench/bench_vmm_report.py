#!/usr/bin/env python3
"""Tables for tools/bench/bench.sh's VMM, PyTorch and exporter-free parts.

usage: bench_vmm_report.py RESULTS_DIR [--append FILE]

Reads RESULTS_DIR/raw/: vmm_rebuild_d<D>_<pass>.txt (tests/gpu/vmm_rebuild.c),
legacy_pair_d<D>.csv (tools/bench/ipcbench.cu, driver API, 512 MiB),
torch_<alloc>.json and shapes_<alloc>.json (tools/bench/bench_torch_vmm.py), ghost_free_i<N>_<pass>.txt
(tests/gpu/ghost_free.cu) and the B passes' stats lines. Prints markdown
tables with the performance targets and whether each was met; writes
RESULTS_DIR/vmm_summary.json; with --append adds the tables to FILE (in place
of the ones an earlier report put there).
"""
import argparse
import csv
import glob
import json
import os
import re
import statistics
import sys

PASSES = ["A1", "B", "A2"]
CALLS = ["getfd", "import", "reserve", "map", "set_access", "unmap", "release", "address_free"]
MARK = "<!-- bench_vmm_report -->"
FEATURE_TARGET_US = 100.0
RL_EXPANDABLE_RATIO = 1.2
RL_LEGACY_SPEEDUP = 2.0


def key_values(text):
    return dict(re.findall(r"(\w+)=([^\s]+)", text))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def stats_sum(raw, tag, key):
    """The key summed over every stats line a B pass left (one file per process)."""
    total, seen = 0, False
    for path in glob.glob(os.path.join(raw, "stats_%s_B.*.json" % tag)):
        lines = read(path).splitlines()
        if lines:
            total += json.loads(lines[-1]).get(key, 0)
            seen = True
    return total if seen else None


def devices(raw, prefix):
    found = set()
    for path in glob.glob(os.path.join(raw, prefix + "*")):
        m = re.search(r"_d(\d+)", os.path.basename(path))
        if m:
            found.add(int(m.group(1)))
    return sorted(found)


def us(v):
    """Microseconds as read: ms from 1000 up, three decimals under 10."""
    if v is None:
        return "-"
    v = float(v)
    if v >= 1000:
        return "%.2f ms" % (v / 1000)
    return ("%.3f µs" if v < 10 else "%.1f µs") % v


# ------------------------------------------------------------- VMM hit path

def load_vmm(raw):
    out = []
    for dev in devices(raw, "vmm_rebuild_d"):
        row = {"device": dev}
        for p in PASSES:
            text = read(os.path.join(raw, "vmm_rebuild_d%d_%s.txt" % (dev, p)))
            kv = key_values(text)
            calls = {}
            for line in text.splitlines():
                if line.startswith("per_call_us"):
                    calls = {k: float(v) for k, v in key_values(line).items()}
            row[p] = {"rebuild_us": float(kv["median_us"]) if "median_us" in kv else None,
                      "calls": calls, "check": kv.get("check")}
        row["import_hits"] = stats_sum(raw, "vmm_rebuild_d%d" % dev, "vmm_import_hits")
        row["map_hits"] = stats_sum(raw, "vmm_rebuild_d%d" % dev, "vmm_map_hits")
        row["access_skips"] = stats_sum(raw, "vmm_rebuild_d%d" % dev, "vmm_access_skips")
        row["legacy"] = load_legacy(os.path.join(raw, "legacy_pair_d%d.csv" % dev))
        out.append(row)
    return out


def load_legacy(path):
    """ipcbench's real pair (A1, A2) and hit pair (B), ns."""
    pairs = {}
    try:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("threads") == "1" and r["mode"] in ("real_pair", "held_pair", "shim_hit_pair"):
                    pairs["%s_%s" % (r["mode"], r["pass"])] = float(r["median_ns"])
    except (OSError, KeyError, ValueError):
        pass
    return pairs


def vmm_markdown(rows):
    md = []
    for r in rows:
        where = "same GPU" if r["device"] == 0 else "importer on GPU %d" % r["device"]
        md += ["", "Cached VMM rebuild, driver API, 26 chunks of 20 MiB (%s): median per call, "
               "each call timed on its own (one clock reading included)" % where, "",
               "| call | A1 no cache | B cache | A2 no cache |", "| --- | --- | --- | --- |"]
        for c in CALLS:
            md.append("| `%s` | %s |" % (c, " | ".join(us(r[p]["calls"].get(c)) for p in PASSES)))
        md.append("| whole rebuild + read + release | %s |"
                  % " | ".join(us(r[p]["rebuild_us"]) for p in PASSES))
        leg = r["legacy"]
        if leg:
            md.append("| legacy `cuIpcOpenMemHandle` + close pair, 512 MiB | %s | %s | %s |"
                      % (us(leg.get("real_pair_A1", 0) / 1e3), us(leg.get("shim_hit_pair_B", 0) / 1e3),
                         us(leg.get("real_pair_A2", 0) / 1e3)))
        md.append("")
        md.append("Checks: %s; stats of B: %s import hits, %s map hits, %s set-access skips."
                  % (", ".join("%s check=%s" % (p, r[p]["check"]) for p in PASSES),
                     r["import_hits"], r["map_hits"], r["access_skips"]))
    return md


# ----------------------------------------------------------------- PyTorch

def load_torch(raw):
    res = {}
    for alloc in ("legacy", "expandable"):
        text = read(os.path.join(raw, "torch_%s.json" % alloc))
        if text:
            res[alloc] = json.loads(text)
    return res


def torch_row(res, alloc, phase, dev):
    for r in res.get(alloc, {}).get("rows", []):
        if r["phase"] == phase and r["consumer_device"] == dev:
            return r
    return None


def mean_off(res, alloc, dev, key):
    vals = [torch_row(res, alloc, p, dev)[key] for p in ("A1", "A2") if torch_row(res, alloc, p, dev)]
    return statistics.mean(vals) if vals else None


def torch_devices(res):
    return sorted({r["consumer_device"] for v in res.values() for r in v["rows"]})


FEATURE_PASSES = [
    ("idle_", "the producer idle (pool filled once before the pass; the issue's setting)"),
    ("", "the producer busy (it fills each slice on GPU 0 just before sending it)"),
]


def feature_markdown(res, verdicts):
    md = []
    for prefix, what in FEATURE_PASSES:
        md += feature_table(res, verdicts, prefix, what)
    return md


def feature_table(res, verdicts, prefix, what):
    key = prefix + "feature_us_p50"
    md = ["", "PyTorch, rebuild + use + release of a 1 MiB slice of a 512 MiB pool, median per feature, "
          "%s; producer on GPU 0; B's rebuild / use / release beside:" % what, "",
          "| allocator | consumer | A1 no cache | B cache | A2 no cache | no cache / cache | B: rebuild / use / release |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for alloc in ("legacy", "expandable"):
        for dev in torch_devices(res):
            rows = [torch_row(res, alloc, p, dev) for p in PASSES]
            if not all(rows) or key not in rows[0]:
                continue
            b, off = rows[1], mean_off(res, alloc, dev, key)
            md.append("| %s | GPU %d | %s | %s | %s | %.1fx | %s / %s / %s |" % (
                alloc, dev, *(us(r[key]) for r in rows), off / b[key],
                us(b[prefix + "rebuild_us_p50"]), us(b[prefix + "use_us_p50"]),
                us(b[prefix + "release_us_p50"])))
            if alloc == "expandable":
                verdicts.append(("expandable segments with the cache <= %d µs per feature, consumer on GPU %d, "
                                 "producer %s" % (FEATURE_TARGET_US, dev, "idle" if prefix else "busy"),
                                 "%s" % us(b[key]), b[key] <= FEATURE_TARGET_US))
    for dev in torch_devices(res):
        leg, exp = torch_row(res, "legacy", "B", dev), torch_row(res, "expandable", "B", dev)
        if leg and exp and key in leg and key in exp:
            md.append("")
            md.append("Consumer on GPU %d: expandable + cache / legacy + cache = %.2fx." % (dev, exp[key] / leg[key]))
    return md


def rl_parts(row):
    keys = ("share_ms_p50", "rl_rebuild_ms_p50", "rl_use_ms_p50", "rl_release_ms_p50")
    if not all(k in row for k in keys):
        return "-"
    return " / ".join("%.2f ms" % row[k] for k in keys)


def rl_markdown(res, verdicts):
    any_res = next(iter(res.values()), {})
    md = ["", "RL weight sync: the trainer shares %d parameter tensors (%.2f GiB) every step; the engine "
          "rebuilds them, copies each into its own weights and drops them. Median per step (trainer's "
          "share to engine's ack) and steps/s; B's step in parts beside: the trainer's share "
          "(pickling), the engine's rebuild, copy and drop:" % (any_res.get("rl_tensors", 0),
                                                   any_res.get("rl_bytes", 0) / 2**30), "",
          "| allocator | engine | A1 no cache | B cache | A2 no cache | no cache / cache "
          "| B: share / rebuild / copy / drop |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    step = {}
    for alloc in ("legacy", "expandable"):
        for dev in torch_devices(res):
            rows = [torch_row(res, alloc, p, dev) for p in PASSES]
            if not all(rows) or "step_ms_p50" not in rows[0]:
                continue
            off = mean_off(res, alloc, dev, "step_ms_p50")
            step[alloc, dev] = (off, rows[1]["step_ms_p50"])
            md.append("| %s | GPU %d | %s |" % (alloc, dev, " | ".join(
                "%.1f ms, %.1f steps/s" % (r["step_ms_p50"], r["steps_per_s"]) for r in rows)
                + " | %.2fx | %s" % (off / rows[1]["step_ms_p50"], rl_parts(rows[1]))))
    for dev in torch_devices(res):
        if ("legacy", dev) in step and ("expandable", dev) in step:
            ratio = step["expandable", dev][1] / step["legacy", dev][1]
            verdicts.append(("RL, engine on GPU %d: expandable + cache within %.1fx of legacy + cache"
                             % (dev, RL_EXPANDABLE_RATIO), "%.2fx" % ratio, ratio <= RL_EXPANDABLE_RATIO))
        if ("legacy", dev) in step:
            off, on = step["legacy", dev]
            verdicts.append(("RL, engine on GPU %d: legacy + cache >= %.0fx faster than legacy without"
                             % (dev, RL_LEGACY_SPEEDUP), "%.2fx" % (off / on), off / on >= RL_LEGACY_SPEEDUP))
    return md


# -------------------------------------------------------------- exporter free

SHAPES_IN_ORDER = ("one", "all", "buckets", "two", "one_synced")
# Diagnostic: "one" with the engine waiting for each copy before the drop, as
# PyTorch's own release of an imported expandable segment does.
SHAPE_NOTES = {"one_synced": " (both allocators wait for each copy: the mapping's own cost)"}
PIECE_PARTS = ("rebuild", "copy", "wait", "release")


def load_shapes(raw):
    """shapes_<alloc>[_r<N>].json (bench_torch_vmm.py --shapes, one per
    repetition): {alloc: {(shape, phase): row}}, each figure the median over
    the repetitions (VMM counts summed), and under "ratios" {shape: [expandable
    B / legacy B of each repetition]}: the two allocators of one repetition ran
    one after the other, so drift between repetitions stays out of the ratio."""
    reps = {}
    for alloc in ("legacy", "expandable"):
        paths = sorted(glob.glob(os.path.join(raw, "shapes_%s.json" % alloc)) +
                       glob.glob(os.path.join(raw, "shapes_%s_r*.json" % alloc)))
        for path in paths:
            rep = os.path.basename(path)[len("shapes_%s" % alloc):-len(".json")] or "_r1"
            for r in json.loads(read(path))["shapes"]:
                reps.setdefault(alloc, {}).setdefault((r["shape"], r["phase"]), {})[rep] = r
    res = {alloc: {key: merge_reps(list(by_rep.values())) for key, by_rep in rows.items()}
           for alloc, rows in reps.items()}
    ratios = {}
    for (shape, phase), by_rep in reps.get("expandable", {}).items():
        leg = reps.get("legacy", {}).get((shape, phase), {})
        if phase == "B":
            ratios[shape] = [r["step_ms_p50"] / leg[k]["step_ms_p50"] for k, r in sorted(by_rep.items()) if k in leg]
    res["ratios"] = ratios
    return res


def merge_reps(rows):
    out = dict(rows[0])
    for k, v in rows[0].items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        vals = [r[k] for r in rows if k in r]
        out[k] = sum(vals) if k.startswith("vmm_") else round(statistics.median(vals), 2)
    out["values_ok"] = all(r.get("values_ok", False) for r in rows)
    out["reps"] = len(rows)
    return out


def shapes_markdown(res, verdicts):
    """Issue 17's table: per-step ms without (mean of A1, A2) / with, both
    allocators, and the expandable engine's VMM map hits with the cache."""
    if "expandable" not in res:
        return []
    names = sorted({k[0] for k in res["expandable"]}, key=lambda n: (n not in SHAPES_IN_ORDER, n))
    md = ["", "### Weight-sync shapes (median step, ms; without / with; steps/s with)", "",
          "| shape | legacy | expandable | expandable steps/s | VMM map hits with the cache |",
          "| --- | --- | --- | --- | --- |"]
    for name in names:
        cells = []
        for alloc in ("legacy", "expandable"):
            rows = res.get(alloc, {})
            off = [rows[(name, p)]["step_ms_p50"] for p in ("A1", "A2") if (name, p) in rows]
            on = rows.get((name, "B"))
            cells.append("%s / %s" % (round(sum(off) / len(off), 2) if off else "-",
                                      on["step_ms_p50"] if on else "-"))
        b = res["expandable"].get((name, "B"), {})
        maps, hits = b.get("vmm_maps", 0), b.get("vmm_map_hits", 0)
        md.append("| %s | %s | %s | %s | %s of %s (%s%%) |" % (
            name, cells[0], cells[1], b.get("steps_per_s", "-"), hits, maps,
            round(100.0 * hits / maps, 1) if maps else "-"))
        leg = res.get("legacy", {}).get((name, "B"))
        off = [res["expandable"][(name, p)]["step_ms_p50"] for p in ("A1", "A2")
               if (name, p) in res["expandable"]]
        if name in SHAPES_IN_ORDER and leg and b:
            each = res.get("ratios", {}).get(name) or [b["step_ms_p50"] / leg["step_ms_p50"]]
            ratio = statistics.median(each)
            got = "%.2fx" % ratio + (" (median of %s)" % ", ".join("%.2f" % r for r in each) if len(each) > 1 else "")
            verdicts.append(("shape %s: expandable with the cache within 1.2x of legacy with it%s"
                             % (name, SHAPE_NOTES.get(name, "")), got, ratio <= 1.2))
        elif b and off:
            mean = sum(off) / len(off)
            verdicts.append(("shape %s: expandable with the cache no slower than without" % name,
                             "%s vs %.2f ms" % (b["step_ms_p50"], mean), b["step_ms_p50"] <= mean))
    return md + pieces_markdown(res)


def pieces_markdown(res):
    """Where a one-tensor-at-a-time step goes: the engine's median per tensor
    and the trainer's share (pickling) per step, without (A1) and with (B)."""
    rows = [(name, alloc, phase, res[alloc][(name, phase)])
            for name in ("one", "one_synced") for alloc in ("legacy", "expandable")
            for phase in ("A1", "B") if (name, phase) in res.get(alloc, {})]
    rows = [r for r in rows if "piece_rebuild_us" in r[3]]
    if not rows:
        return []
    md = ["", "### One tensor at a time: the engine's median per tensor (us), the trainer's share per step (ms)",
          "", "| shape | alloc | cache | rebuild | copy | wait | drop | share |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, alloc, phase, r in rows:
        md.append("| %s | %s | %s | %s | %s |" % (
            name, alloc, "on" if phase == "B" else "off",
            " | ".join(str(r.get("piece_%s_us" % part, "-")) for part in PIECE_PARTS), r.get("share_ms_p50", "-")))
    return md


def load_ghost(raw):
    rows = []
    for n in (0, 1, 8):
        passes = {p: key_values(read(os.path.join(raw, "ghost_free_i%d_%s.txt" % (n, p)))) for p in PASSES}
        if any(passes.values()):
            rows.append({"importers": n, **passes,
                         "releases_on_request": stats_sum(raw, "ghost_free_i%d" % n, "releases_on_request")})
    return rows


def ghost_markdown(rows):
    if not rows:
        return []
    size = int(rows[0]["A1"].get("size", 0)) >> 20
    md = ["", "The exporter's `cudaFree` of a %d MiB allocation it exported, importers holding idle cached "
          "mappings (same GPU; the preload on both sides in B), median / p99; then its `cudaMalloc` and "
          "`cudaFree` of memory never exported:" % size, "",
          "| importers | what | A1 no cache | B cache | A2 no cache |", "| --- | --- | --- | --- | --- |"]

    def cell(kv, key):
        if key + "_median" not in kv:
            return "-"
        return "%s / %s" % (us(kv[key + "_median"]), us(kv[key + "_p99"]))

    for r in rows:
        md.append("| %d | free of exported memory | %s |"
                  % (r["importers"], " | ".join(cell(r[p], "free_us") for p in PASSES)))
    for what, key in (("free, never exported", "plain_free_us"), ("malloc, never exported", "plain_malloc_us")):
        md.append("| %d | %s | %s |" % (rows[-1]["importers"], what,
                                       " | ".join(cell(rows[-1][p], key) for p in PASSES)))
    md.append("")
    md.append("Memory given back by every free as without the cache (ok=1): %s. Releases on request (B): %s." % (
        ", ".join("%d importers %s" % (r["importers"], "/".join(r[p].get("ok", "?") for p in PASSES))
                  for r in rows),
        ", ".join("%d importers %s" % (r["importers"], r["releases_on_request"]) for r in rows)))
    return md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results_dir")
    ap.add_argument("--append")
    a = ap.parse_args(argv)
    raw = os.path.join(a.results_dir, "raw")
    vmm, res, ghost, verdicts = load_vmm(raw), load_torch(raw), load_ghost(raw), []
    shapes = load_shapes(raw)
    md = [MARK, "", "## VMM path, PyTorch allocators, exporter frees", ""]
    md += vmm_markdown(vmm)
    if res:
        md += feature_markdown(res, verdicts) + rl_markdown(res, verdicts)
    md += shapes_markdown(shapes, verdicts)
    md += ghost_markdown(ghost)
    md += ["", "Targets:", ""]
    md += ["- %s: %s, **%s**" % (what, got, "met" if ok else "not met") for what, got, ok in verdicts]
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(a.results_dir, "vmm_summary.json"), "w") as f:
        json.dump({"vmm": vmm, "torch": res, "ghost": ghost,
                   "shapes": {a: list(rows.values()) for a, rows in shapes.items()},
                   "targets": [{"what": w, "got": g, "met": ok} for w, g, ok in verdicts]}, f, indent=1)
    if a.append:
        before = read(a.append).split(MARK)[0]
        with open(a.append, "w") as f:
            f.write(before.rstrip("\n") + ("\n\n" if before.strip() else "") + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
