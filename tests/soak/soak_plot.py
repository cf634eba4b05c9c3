#!/usr/bin/env python3
"""soak_plot.py OUT WITH [WITHOUT]

The stand-in soak's plots: one PNG per series in OUT, each importer a line
against time, the run with the library on the left and without on the right
(the folders build/tests/soak wrote). Needs matplotlib (Debian:
python3-matplotlib); tests/soak/soak.sh skips the plots, saying so, without it.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from soak_verdict import IMPORTER_SERIES, value  # noqa: E402

IMPORTER_PLOTS = [
    ("rss_kib", "RSS (KiB)"),
    ("fds", "open fds"),
    ("fds_not_kept", "open fds, less those the library keeps (judged)"),
    ("driver_bytes", "bytes the driver maps for it"),
    ("ghost_bytes", "of those, freed by their exporter or of one that died"),
    ("lib_entries", "library table entries (live + idle)"),
    ("lib_idle", "library idle entries"),
    ("lib_idle_bytes", "library idle bytes"),
    ("lib_mem_bytes", "library's own memory (mem_bytes)"),
    ("lib_vmm_fds", "fds the library keeps (vmm_fds)"),
    ("hit_rate", "hit rate this second (%)"),
    ("opens", "opens + VMM imports"),
]
MACHINE_PLOTS = [
    ("phys_bytes", "stand-in physical bytes (allocated, or freed and mapped)"),
    ("ghost_bytes", "of those, freed (or of a dead exporter) and still mapped"),
    ("ledger_importers", "release ledger: importer slots in use"),
    ("ledger_exports", "release ledger: exports listed"),
    ("exporters_alive", "exporters alive"),
]


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(row, col):
    v = row.get(col, "")
    return float(v) if v != "" else None


def importer_series(rows, col):
    """importer -> (ts, ys) for col, or a derived series."""
    out, prev = {}, {}
    for r in rows:
        imp, t = r["importer"], float(r["t_s"])
        if col == "lib_entries":
            a, b = num(r, "lib_live"), num(r, "lib_idle")
            y = None if a is None or b is None else a + b
        elif col == "fds_not_kept":
            y = value(r, IMPORTER_SERIES["fds"][0])  # the series the verdict judges
        elif col == "opens":
            y = float(r["opens"]) + float(r["imports"])
        elif col == "hit_rate":
            o, h = num(r, "lib_opens"), num(r, "lib_hits")
            if o is None:
                continue
            o += num(r, "lib_vmm_imports")
            h += num(r, "lib_vmm_import_hits")
            po, ph = prev.get(imp, (o, h))
            prev[imp] = (o, h)
            y = 100.0 * (h - ph) / (o - po) if o > po else None
        else:
            y = num(r, col)
        if y is None:
            continue
        ts, ys = out.setdefault(imp, ([], []))
        ts.append(t)
        ys.append(y)
    return out


def plot(out, name, title, runs, series_of):
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4), squeeze=False, sharey=True)
    for ax, (label, folder) in zip(axes[0], runs):
        for key, (ts, ys) in sorted(series_of(folder).items()):
            ax.plot(ts, ys, linewidth=0.8, label=key)
        ax.set_title("%s the library" % label)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(title)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name + ".png"), dpi=90)
    plt.close(fig)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    runs = list(zip(["with", "without"], sys.argv[2:4]))
    os.makedirs(out, exist_ok=True)
    for col, title in IMPORTER_PLOTS:
        plot(out, "importers-" + col, title, runs,
             lambda f, c=col: importer_series(read(os.path.join(f, "importers.csv")), c))
    for col, title in MACHINE_PLOTS:
        def machine(f, c=col):
            rows = read(os.path.join(f, "machine.csv"))
            return {"machine": ([float(r["t_s"]) for r in rows], [float(r[c]) for r in rows])}
        plot(out, "machine-" + col, title, runs, machine)
    print("soak: plots: %s/*.png" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
