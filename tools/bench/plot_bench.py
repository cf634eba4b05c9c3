#!/usr/bin/env python3
"""Aggregate tools/bench/bench.sh results, print the markdown summary, draw the PNG.

usage: plot_bench.py RESULTS_DIR [--png FILE] [--summary FILE]

Reads RESULTS_DIR/raw/ipcbench_*.csv (tools/ipcbench output),
RESULTS_DIR/raw/sglang_*.json (tools/bench/bench_sglang_pattern.py output) and
RESULTS_DIR/machine.json. Repetitions are folded into medians and written to
RESULTS_DIR/ipcbench_summary.csv and RESULTS_DIR/sglang_summary.csv; the
markdown tables (the README's Performance section) go to stdout and to
--summary (default RESULTS_DIR/summary.md); the figure to --png (default
RESULTS_DIR/bench.png) when matplotlib is importable.
"""
import argparse
import csv
import glob
import json
import os
import statistics
import sys

MODES_PLOTTED = [("real_pair", "A1", "real open+close"),
                 ("held_pair", "A1", "driver refcount (one ref held)"),
                 ("shim_hit_pair", "B", "ipccache hit")]
VARIANTS = [("runtime", "static"), ("runtime", "shared"), ("driver", "none")]


# ----------------------------------------------------------------- loading

def load_ipcbench(raw_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(raw_dir, "ipcbench_*.csv"))):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                try:
                    rows.append({
                        "api": r["api"], "cudart": r["cudart"], "size_bytes": int(r["size_bytes"]),
                        "mode": r["mode"], "threads": int(r["threads"]), "iters": int(r["iters"]),
                        "median_ns": float(r["median_ns"]), "p99_ns": float(r["p99_ns"]),
                        "pass": r["pass"], "pairs_per_s": float(r.get("pairs_per_s") or 0),
                        "importer_device": int(r.get("importer_device") or 0),
                        "exporter_device": int(r.get("exporter_device") or 0),
                    })
                except (KeyError, ValueError):
                    continue  # a truncated line from an interrupted run
    return rows


def load_sglang(raw_dir):
    runs = []
    for path in sorted(glob.glob(os.path.join(raw_dir, "sglang_*.json"))):
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError):
            continue
    return runs


def load_machine(results_dir):
    try:
        with open(os.path.join(results_dir, "machine.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# ----------------------------------------------------------------- aggregation

IPC_KEY = ("api", "cudart", "size_bytes", "mode", "threads", "pass", "importer_device", "exporter_device")


def aggregate_ipcbench(rows):
    """Median over repetitions of each (variant, size, mode, threads, pass, devices)."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in IPC_KEY), []).append(r)
    out = []
    for key, rs in sorted(groups.items()):
        agg = dict(zip(IPC_KEY, key))
        agg["reps"] = len(rs)
        for k in ("median_ns", "p99_ns", "pairs_per_s", "iters"):
            agg[k] = statistics.median(r[k] for r in rs)
        out.append(agg)
    return out


def sglang_key(run):
    cfg = run.get("config", {})
    return (run.get("label", ""), cfg.get("device_producer", 0), cfg.get("device_consumer", 0))


def aggregate_sglang(runs):
    """Median over repetitions of each (label, producer device, consumer device)."""
    groups = {}
    for run in runs:
        groups.setdefault(sglang_key(run), []).append(run)
    out = []
    for (label, dp, dc), rs in groups.items():
        agg = {"label": label, "device_producer": dp, "device_consumer": dc, "reps": len(rs),
               "shim": any(r.get("shim") for r in rs), "ok": all(r.get("ok") for r in rs)}
        for phase in ("burst", "rate"):
            for k in ("req_per_s", "lat_mean_ms", "lat_p50_ms", "lat_p99_ms"):
                vals = [r["phases"][phase][k] for r in rs if phase in r.get("phases", {})]
                agg[f"{phase}_{k}"] = statistics.median(vals) if vals else float("nan")
                if k == "req_per_s" and vals:
                    agg[f"{phase}_req_per_s_min"] = min(vals)
                    agg[f"{phase}_req_per_s_max"] = max(vals)
        for k in ("real_opens", "hits", "opens"):
            vals = [r["consumer_stats"][k] for r in rs
                    if isinstance(r.get("consumer_stats"), dict) and k in r["consumer_stats"]]
            agg[f"consumer_{k}"] = statistics.median(vals) if vals else None
        out.append(agg)
    # Same device first, then A1, B, A2 (bench.sh labels start with the pass name).
    out.sort(key=lambda a: (a["device_producer"] != a["device_consumer"], a["device_consumer"],
                            pass_order(a["label"]), a["label"]))
    return out


def pass_order(label):
    head = label.split("-", 1)[0]
    return ["A1", "B", "A2"].index(head) if head in ("A1", "B", "A2") else 3


def write_csv(path, rows):
    if not rows:
        return
    keys = list(rows[0].keys())
    for r in rows[1:]:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


# ----------------------------------------------------------------- markdown

def human_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt_ns(ns):
    if ns is None or ns != ns:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def lookup(agg, **want):
    for a in agg:
        if all(a.get(k) == v for k, v in want.items()):
            return a
    return None


def device_pairs(agg):
    return sorted({(a["exporter_device"], a["importer_device"]) for a in agg},
                  key=lambda p: (p[0] != p[1], p))


def pair_table(agg, exp_dev, imp_dev):
    lines = ["| API | cudart | size | real pair A1 / A2 | driver held pair | ipccache hit | hit vs real |",
             "|---|---|---|---|---|---|---|"]
    sizes = sorted({a["size_bytes"] for a in agg})
    for api, cudart in VARIANTS:
        for size in sizes:
            common = dict(api=api, cudart=cudart, size_bytes=size, threads=1,
                          importer_device=imp_dev, exporter_device=exp_dev)
            a1 = lookup(agg, mode="real_pair", **{"pass": "A1"}, **common)
            a2 = lookup(agg, mode="real_pair", **{"pass": "A2"}, **common)
            held = lookup(agg, mode="held_pair", **{"pass": "A1"}, **common)
            hit = lookup(agg, mode="shim_hit_pair", **{"pass": "B"}, **common)
            if not (a1 or hit):
                continue

            def cell(r):
                return f"{fmt_ns(r['median_ns'])} (p99 {fmt_ns(r['p99_ns'])})" if r else "-"

            real = f"{fmt_ns(a1['median_ns']) if a1 else '-'} / {fmt_ns(a2['median_ns']) if a2 else '-'}"
            speed = f"{a1['median_ns'] / hit['median_ns']:.0f}x" if a1 and hit and hit["median_ns"] else "-"
            lines.append(f"| {api} | {cudart} | {human_size(size)} | {real} | {cell(held)} | {cell(hit)} | {speed} |")
    return lines


def thread_table(agg, exp_dev, imp_dev):
    """Concurrency at one size (64M when measured) for one variant (runtime/shared when measured)."""
    sizes = sorted({a["size_bytes"] for a in agg})
    present = [v for v in VARIANTS if any((a["api"], a["cudart"]) == v for a in agg)]
    if not sizes or not present:
        return []
    size = (64 << 20) if (64 << 20) in sizes else sizes[0]
    api, cudart = ("runtime", "shared") if ("runtime", "shared") in present else present[0]
    threads = sorted({a["threads"] for a in agg if a["mode"].endswith("threads")})
    lines = [f"Concurrent pairs on one {human_size(size)} handle, {api} API"
             f"{'' if cudart == 'none' else ', cudart ' + cudart} (per-pair median; aggregate pairs/s):", "",
             "| threads | driver held pair | ipccache hit |", "|---|---|---|"]

    def cell(r):
        return f"{fmt_ns(r['median_ns'])}; {r['pairs_per_s'] / 1e6:.2f} M/s" if r else "-"

    for n in threads:
        common = dict(api=api, cudart=cudart, size_bytes=size, threads=n,
                      importer_device=imp_dev, exporter_device=exp_dev)
        held = lookup(agg, mode=f"held_pair_{n}threads", **{"pass": "A1"}, **common)
        hit = lookup(agg, mode=f"shim_hit_pair_{n}threads", **{"pass": "B"}, **common)
        if held or hit:
            lines.append(f"| {n} | {cell(held)} | {cell(hit)} |")
    return lines


def sglang_table(sg):
    lines = ["| run | ipccache | GPUs (producer→consumer) | burst req/s | burst p50 / p99 ms | "
             "fixed-rate p50 / p99 ms | consumer real opens / hits |",
             "|---|---|---|---|---|---|---|"]
    for a in sg:
        def num(k, fmt="{:.1f}"):
            v = a.get(k)
            return fmt.format(v) if isinstance(v, (int, float)) and v == v else "-"

        stats = "-"
        if a.get("consumer_real_opens") is not None:
            stats = f"{a['consumer_real_opens']:.0f} / {a['consumer_hits']:.0f}"
        lines.append(
            f"| {a['label'] or '-'} | {'on' if a['shim'] else 'off'} | {a['device_producer']}→{a['device_consumer']} "
            f"| {num('burst_req_per_s')} | {num('burst_lat_p50_ms', '{:.2f}')} / {num('burst_lat_p99_ms', '{:.2f}')} "
            f"| {num('rate_lat_p50_ms', '{:.2f}')} / {num('rate_lat_p99_ms', '{:.2f}')} | {stats} |")
    return lines


def machine_line(machine):
    parts = []
    for k, label in (("gpu_name", "GPU"), ("gpu_count", "GPUs"), ("driver_version", "driver"),
                     ("cuda_version", "CUDA"), ("torch_version", "torch"), ("cpu_count", "CPUs")):
        if machine.get(k) not in (None, ""):
            parts.append(f"{label} {machine[k]}")
    return ", ".join(parts)


def summary_markdown(agg, sg, machine, sglang_cfg):
    out = []
    ml = machine_line(machine)
    if ml:
        out += [f"Machine: {ml}.", ""]
    for exp_dev, imp_dev in device_pairs(agg):
        where = "same GPU" if exp_dev == imp_dev else f"exporter GPU {exp_dev}, importer GPU {imp_dev}"
        out += [f"CUDA IPC open+close pair latency, {where} (median, p99; medians over repetitions):", ""]
        out += pair_table(agg, exp_dev, imp_dev) + [""]
        tt = thread_table(agg, exp_dev, imp_dev) if exp_dev == imp_dev else []
        if len(tt) > 4:
            out += tt + [""]
    if sg:
        desc = ""
        if sglang_cfg:
            desc = (f" ({sglang_cfg.get('features')} features of {sglang_cfg.get('rows')}x"
                    f"{sglang_cfg.get('cols')} bf16 per request, {sglang_cfg.get('requests')}-request burst, "
                    f"{sglang_cfg.get('rate_requests')} requests at {sglang_cfg.get('rate'):g} req/s)")
        out += [f"SGLang-pattern transport{desc}, A/B/A:", ""] + sglang_table(sg) + [""]
    return "\n".join(out)


# ----------------------------------------------------------------- figure

def draw(agg, sg, machine, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench: matplotlib not available; no PNG", file=sys.stderr)
        return False
    # Top: pair latency across the width (legend at its side); bottom: SGLang.
    fig = plt.figure(figsize=(14, 10))
    gs = fig.add_gridspec(2, 2, height_ratios=[1.15, 1])
    draw_pairs(fig.add_subplot(gs[0, :]), agg)
    draw_sglang(fig.add_subplot(gs[1, 0]), fig.add_subplot(gs[1, 1]), sg)
    title = "ipccache: CUDA IPC open+close cost"
    ml = machine_line(machine)
    fig.suptitle(f"{title} — {ml}" if ml else title, fontsize=11)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


def draw_pairs(ax, agg):
    colors = {"real_pair": "tab:red", "held_pair": "tab:orange", "shim_hit_pair": "tab:green"}
    styles = {("runtime", "static"): ("o", "-"), ("runtime", "shared"): ("s", "--"), ("driver", "none"): ("^", ":")}
    sizes = sorted({a["size_bytes"] for a in agg})

    def series(mode, pas, api, cudart, same_device):
        pts = sorted((a["size_bytes"], a["median_ns"]) for a in agg
                     if a["mode"] == mode and a["pass"] == pas and a["api"] == api and a["cudart"] == cudart
                     and (a["importer_device"] == a["exporter_device"]) == same_device and a["threads"] == 1)
        return [p[0] for p in pts], [p[1] for p in pts]

    for mode, pas, label in MODES_PLOTTED:
        for (api, cudart), (marker, ls) in styles.items():
            xs, ys = series(mode, pas, api, cudart, True)
            if xs:
                ax.plot(xs, ys, marker=marker, linestyle=ls, color=colors[mode],
                        label=f"{label} ({api}{'/' + cudart if cudart != 'none' else ''})")
    # Across GPUs the real pair costs far more (peer mapping); one variant is enough to show it.
    for mode, pas, label in MODES_PLOTTED:
        if mode == "held_pair":
            continue
        xs, ys = series(mode, pas, "runtime", "shared", False)
        if xs:
            ax.plot(xs, ys, marker="x", linestyle="-.", color=colors[mode], alpha=0.6,
                    label=f"{label} (runtime/shared, other GPU)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if sizes:
        ax.set_xticks(sizes)
        ax.set_xticklabels([human_size(s) for s in sizes])
    ax.set_xlabel("allocation size")
    ax.set_ylabel("median ns per open+close pair (log)")
    ax.set_title("Latency per open+close pair")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def draw_sglang(ax_tp, ax_lat, sg):
    if not sg:
        for ax in (ax_tp, ax_lat):
            ax.text(0.5, 0.5, "no SGLang-pattern results", ha="center", va="center", transform=ax.transAxes)
        return
    labels = [f"{a['label'] or '-'}\n{'cache on' if a['shim'] else 'cache off'}"
              + ("" if a["device_producer"] == a["device_consumer"] else f"\nGPU{a['device_producer']}→{a['device_consumer']}")
              for a in sg]
    xs = list(range(len(sg)))
    colors = ["tab:green" if a["shim"] else "tab:gray" for a in sg]
    tp = [a.get("burst_req_per_s", float("nan")) for a in sg]
    lo = [t - a.get("burst_req_per_s_min", t) for t, a in zip(tp, sg)]
    hi = [a.get("burst_req_per_s_max", t) - t for t, a in zip(tp, sg)]
    ax_tp.bar(xs, tp, color=colors, yerr=[lo, hi], capsize=3)
    ax_tp.set_xticks(xs)
    ax_tp.set_xticklabels(labels, fontsize=7)
    ax_tp.set_ylabel("requests/s (burst)")
    ax_tp.set_title("SGLang pattern: throughput")
    w = 0.38
    burst = [a.get("burst_lat_p99_ms", float("nan")) for a in sg]
    rate = [a.get("rate_lat_p99_ms", float("nan")) for a in sg]
    ax_lat.bar([x - w / 2 for x in xs], burst, w, color=colors, edgecolor="black", label="burst p99")
    ax_lat.bar([x + w / 2 for x in xs], rate, w, color=colors, edgecolor="black", hatch="//",
               label="fixed-rate p99")
    ax_lat.set_xticks(xs)
    ax_lat.set_xticklabels(labels, fontsize=7)
    # Burst p99 is dominated by queueing (ring depth / throughput), fixed-rate
    # p99 by the per-request cost: a log axis keeps both readable.
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("p99 latency, ms (log)")
    ax_lat.set_title("SGLang pattern: p99 latency")
    ax_lat.legend(fontsize=7, loc="best")


# ----------------------------------------------------------------- main

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results_dir")
    p.add_argument("--png")
    p.add_argument("--summary")
    args = p.parse_args(argv)
    d = args.results_dir
    raw = os.path.join(d, "raw")
    agg = aggregate_ipcbench(load_ipcbench(raw))
    runs = load_sglang(raw)
    sg = aggregate_sglang(runs)
    machine = load_machine(d)
    write_csv(os.path.join(d, "ipcbench_summary.csv"), agg)
    write_csv(os.path.join(d, "sglang_summary.csv"), sg)
    sglang_cfg = runs[0].get("config") if runs else None
    md = summary_markdown(agg, sg, machine, sglang_cfg)
    if not md.strip():
        print("plot_bench: no results found under " + raw, file=sys.stderr)
        return 1
    print(md)
    with open(args.summary or os.path.join(d, "summary.md"), "w") as f:
        f.write(md + "\n")
    png = args.png or os.path.join(d, "bench.png")
    if draw(agg, sg, machine, png):
        print(f"plot_bench: wrote {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
