#!/usr/bin/env python3
"""The GPU soak: an engine's processes sampled every second, without and with the library.

  soak_gpu.py sample --out CSV [--interval S] -- CMD...
      runs CMD (the engine bench's serving or weight sync) and, until it
      exits, writes one row per second per process of its tree (its RSS and
      open fds, read from /proc) and one for the device (bytes in use, from
      NVML; nvidia-smi where NVML cannot be loaded); a last device row after
      CMD exited. Exits with CMD's status.
  soak_gpu.py report DIR
      reads DIR/soak_<piece>_<alloc>_<pass>.csv (pass: without, with) and
      the engine's JSON beside each, prints a Markdown table and the verdict,
      and writes DIR/soak.png (with matplotlib). Exit status 0 when every
      check holds, 1 when one fails, 2 when files are missing.

What "flat" means here: a pass's steady part is the engine's timed part (its
requests or steps after the warm-up; the engine's JSON says how long it took),
which ends where the stretch with all the run's processes alive ends (they
exit right after it); without that length, the stretch less its first
WARMUP_SHARE. Over the steady part, the least-squares growth of the
processes' summed RSS and fds, with the library, exceeds the same run's
without by at most RSS_BOUND and FDS_BOUND; the device memory in use (its
median over the steady part, and once every process has exited) is within
DEVICE_SHARE of the run without; no wrong value (--check's counts).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

RSS_BOUND = 64 << 20   # bytes of growth over a pass, beyond the run without
FDS_BOUND = 4          # open files of growth over a pass, beyond the run without
DEVICE_SHARE = 0.01    # device memory in use: with within 1% of without
WARMUP_SHARE = 0.4     # of the stretch where all processes are alive: the warm-up
PASSES = ("without", "with")


# ----------------------------------------------------------------- sampling

def tree_pids(root):
    """root and every process below it (from /proc's parent links)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                # The name is in parentheses and may hold spaces: read after the last ')'.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def process_sample(pid):
    """(rss bytes, open fds) of pid, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return rss, fds


class DeviceMemory:
    """Bytes in use on GPU 0: NVML through pynvml, else nvidia-smi (MiB)."""

    def __init__(self):
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception:  # noqa: BLE001  (no NVML: nvidia-smi below)
            self.nvml = None

    def used(self):
        if self.nvml:
            pynvml, handle = self.nvml
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", "0"], capture_output=True, text=True, timeout=10).stdout
            return int(out.split()[0]) << 20
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return -1


def cmd_sample(args):
    device = DeviceMemory()
    t0 = time.monotonic()
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["t_s", "pid", "rss_bytes", "fds", "device_used_bytes"])
        child = subprocess.Popen(args.command)
        while True:
            t = round(time.monotonic() - t0, 3)
            for pid in tree_pids(child.pid):
                got = process_sample(pid)
                if got:
                    out.writerow([t, pid, got[0], got[1], ""])
            out.writerow([t, "device", "", "", device.used()])
            f.flush()
            try:
                child.wait(timeout=args.interval)
                break
            except subprocess.TimeoutExpired:
                continue
        time.sleep(1.0)  # the driver's teardown of the exited processes
        out.writerow([round(time.monotonic() - t0, 3), "device-after", "", "", device.used()])
    return child.returncode


# ----------------------------------------------------------------- the verdict

def read_series(path):
    """{'rss': [(t, bytes summed over processes)], 'fds': [...], 'device':
    [(t, bytes)], 'device_after': bytes or None, 'processes': n, 'steady':
    (t0, t1), the steady part}."""
    per_t, device, after, pids, alive = {}, [], None, set(), {}
    timed = timed_seconds(path[:-4] + ".json")
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            t = float(row["t_s"])
            if row["pid"] == "device":
                device.append((t, int(row["device_used_bytes"])))
            elif row["pid"] == "device-after":
                after = int(row["device_used_bytes"])
            else:
                pids.add(row["pid"])
                alive[t] = alive.get(t, 0) + 1
                rss, fds = per_t.get(t, (0, 0))
                per_t[t] = (rss + int(row["rss_bytes"]), fds + int(row["fds"]))
    times = sorted(per_t)
    return {"rss": [(t, per_t[t][0]) for t in times], "fds": [(t, per_t[t][1]) for t in times],
            "device": device, "device_after": after, "processes": len(pids), "steady": steady(alive, timed)}


def steady(alive, timed=None, warmup_share=WARMUP_SHARE):
    """(t0, t1): the last `timed` seconds of the stretch where the most
    processes were alive (without `timed`, from WARMUP_SHARE into it); (0, 0)
    without samples."""
    if not alive:
        return (0.0, 0.0)
    most = max(alive.values())
    full = sorted(t for t, n in alive.items() if n == most)
    if timed:
        return (max(full[0], full[-1] - timed), full[-1])
    return (full[0] + (full[-1] - full[0]) * warmup_share, full[-1])


def timed_seconds(path):
    """How long the engine's timed part took (serving: its phases' elapsed
    time; weight sync: its timed steps), from its --out file; None if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, ValueError):
        return None
    total = 0.0
    for r in run.get("results", []):
        total += sum(ph.get("elapsed_s") or 0.0 for ph in r.get("phases", []))
        steps = r.get("step_ms") or []
        total += sum(steps[int(run.get("args", {}).get("warmup") or 0):]) / 1e3
    return total or None


def within(points, span):
    return [(t, v) for t, v in points if span[0] <= t <= span[1]]


def growth(points):
    """The least-squares slope of points times the span they cover: how much
    the series grew (0 for fewer than three points)."""
    pts = points
    if len(pts) < 3:
        return 0.0
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mv = sum(v for _, v in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    if var == 0:
        return 0.0
    slope = sum((t - mt) * (v - mv) for t, v in pts) / var
    return slope * (pts[-1][0] - pts[0][0])


def median_of(points):
    vals = sorted(v for _, v in points)
    return vals[len(vals) // 2] if vals else None


def near(a, b):
    return a is not None and b is not None and b > 0 and a >= 0 and abs(a - b) <= DEVICE_SHARE * b


def judge(without, with_lib):
    """The checks of one piece x allocator: a list of (name, held, text)."""
    checks = []
    sw, sl = without["steady"], with_lib["steady"]
    gw, gl = growth(within(without["rss"], sw)), growth(within(with_lib["rss"], sl))
    checks.append(("rss flat", gl - max(gw, 0.0) <= RSS_BOUND,
                   f"RSS growth after warm-up {gl / 2**20:+.1f} MiB with, {gw / 2**20:+.1f} MiB without "
                   f"(bound: {RSS_BOUND >> 20} MiB beyond without)"))
    fw, fl = growth(within(without["fds"], sw)), growth(within(with_lib["fds"], sl))
    checks.append(("fds flat", fl - max(fw, 0.0) <= FDS_BOUND,
                   f"open-fd growth after warm-up {fl:+.1f} with, {fw:+.1f} without (bound: {FDS_BOUND} beyond)"))
    dw, dl = median_of(within(without["device"], sw)), median_of(within(with_lib["device"], sl))
    checks.append(("device memory", near(dl, dw),
                   f"device memory in use, median of the steady part, {fmt_gib(dl)} with, {fmt_gib(dw)} "
                   f"without (within {DEVICE_SHARE:.0%})"))
    aw, al = without["device_after"], with_lib["device_after"]
    checks.append(("device memory after", near(al, aw),
                   f"once every process exited {fmt_gib(al)} with, {fmt_gib(aw)} without"))
    return checks


def fmt_gib(v):
    return "-" if v is None or v < 0 else f"{v / 2**30:.3f} GiB"


def engine_errors_and_wrong(path):
    """(errors, wrong values, values checked) from an engine bench --out file."""
    try:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
    except (OSError, ValueError):
        return [f"{os.path.basename(path)} missing or unreadable"], 0, 0
    errors, wrong, checked = [], 0, 0
    for r in run.get("results", []):
        if r.get("error"):
            errors.append(r["error"])
        wrong += r.get("wrong_tensors", 0) or 0
        checked += r.get("checked_tensors", 0) or 0
        for ph in r.get("phases", []):
            wrong += ph.get("wrong_features", 0) or 0
            checked += ph.get("requests", 0) or 0
    return errors, wrong, checked


def cells(directory):
    """(piece, alloc) pairs that have both passes' CSVs."""
    found = set()
    for name in os.listdir(directory):
        parts = name[:-4].split("_") if name.startswith("soak_") and name.endswith(".csv") else []
        if len(parts) == 4 and parts[3] in PASSES:
            found.add((parts[1], parts[2]))
    return sorted(found)


def plot(directory, data):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak: matplotlib not found: no soak.png", file=sys.stderr)
        return
    keys = list(data)
    fig, axes = plt.subplots(3, len(keys), figsize=(4.2 * len(keys), 9), squeeze=False)
    rows = (("device", "device memory in use (GiB)", 2**30), ("rss", "RSS, all processes (GiB)", 2**30),
            ("fds", "open fds, all processes", 1))
    for col, key in enumerate(keys):
        for row, (series, label, unit) in enumerate(rows):
            ax = axes[row][col]
            for pass_name, style in (("without", "-"), ("with", "--")):
                pts = data[key][pass_name][series]
                ax.plot([t for t, _ in pts], [v / unit for _, v in pts], style, label=pass_name)
            ax.set_title(f"{key[0]}, {key[1]}" if row == 0 else "")
            ax.set_ylabel(label if col == 0 else "")
            ax.set_xlabel("s" if row == 2 else "")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "soak.png"), dpi=90)


def cmd_report(args):
    found = cells(args.dir)
    if not found:
        print(f"soak: no soak_<piece>_<alloc>_{{without,with}}.csv in {args.dir}", file=sys.stderr)
        return 2
    lines = ["| piece | allocator | processes | check | held | figures |", "| --- | --- | --- | --- | --- | --- |"]
    failed, data = 0, {}
    for piece, alloc in found:
        base = os.path.join(args.dir, f"soak_{piece}_{alloc}")
        try:
            series = {p: read_series(f"{base}_{p}.csv") for p in PASSES}
        except (OSError, KeyError, ValueError) as exc:
            print(f"soak: {base}: {exc}", file=sys.stderr)
            return 2
        data[(piece, alloc)] = series
        checks = judge(series["without"], series["with"])
        for p in PASSES:
            errors, wrong, checked = engine_errors_and_wrong(f"{base}_{p}.json")
            checks.append((f"values ({p})", not errors and wrong == 0,
                           f"{wrong} wrong of {checked} checked" + (f"; errors: {'; '.join(errors)}" if errors else "")))
        procs = f"{series['without']['processes']} / {series['with']['processes']}"
        for name, held, text in checks:
            failed += 0 if held else 1
            lines.append(f"| {piece} | {alloc} | {procs} | {name} | {'yes' if held else '**no**'} | {text} |")
    plot(args.dir, data)
    lines += ["", f"soak: {'every check held' if not failed else f'{failed} check(s) failed'}"]
    print("\n".join(lines))
    return 1 if failed else 0


def main(argv):
    p = argparse.ArgumentParser(prog="soak_gpu.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=1.0)
    s.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("report")
    r.add_argument("dir")
    args = p.parse_args(argv)
    if args.cmd == "sample":
        if args.command and args.command[0] == "--":
            args.command = args.command[1:]
        if not args.command:
            p.error("sample: no command after --")
        return cmd_sample(args)
    return cmd_report(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
