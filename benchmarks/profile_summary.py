"""Summarise an Nsight Compute CSV (``ncu --csv --page raw``) per kernel: time, DRAM and L2 traffic,
FP32 rate, occupancy and the main stall reasons.  python3 profile_summary.py ncu.csv"""

import csv
import re
import sys
from collections import defaultdict


def short(name: str) -> str:
    name = re.sub(r"\(.*", "", name.replace("pvm::kernels::", ""))
    return name.replace("void ", "").strip()


def main(path: str) -> None:
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    header, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    if "Kernel Name" not in col:
        print("no kernels in", path)
        return

    def val(r, key):
        try:
            return float(r[col[key]].replace(",", ""))
        except (KeyError, ValueError):
            return float("nan")

    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(units[col["gpu__time_duration.sum"]], 1e-3)
    byname = defaultdict(list)
    for r in data:
        byname[short(r[col["Kernel Name"]])].append(r)
    stalls = ["long_scoreboard", "barrier", "mio_throttle", "short_scoreboard", "math_pipe_throttle", "lg_throttle"]
    print("stall columns: each reason's share (%) of the stalls of the six reasons listed\n")
    print("| kernel | n | µs | DRAM GB/s | DRAM % | SM % | L2 GB/s | FP32 GFLOP/s | warps active % | regs | "
          + " | ".join(stalls) + " |")
    print("|---" * (10 + len(stalls)) + "|")
    total = 0.0
    for name, rs in sorted(byname.items(), key=lambda kv: -sum(val(r, "gpu__time_duration.sum") for r in kv[1])):
        mean = lambda key: sum(val(r, key) for r in rs) / len(rs)  # noqa: E731
        us = mean("gpu__time_duration.sum") * scale
        total += us
        gbs = lambda key: mean(key) / 1e9  # noqa: E731  (base units: byte/second)
        flops = 2 * mean("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum") / (us * 1e3)
        cells = [name, str(len(rs)), f"{us:.1f}", f"{gbs('dram__bytes.sum.per_second'):.0f}",
                 f"{mean('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.0f}",
                 f"{mean('sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f}",
                 f"{gbs('lts__t_bytes.sum.per_second'):.0f}", f"{flops:.0f}",
                 f"{mean('sm__warps_active.avg.pct_of_peak_sustained_active'):.0f}",
                 f"{mean('launch__registers_per_thread'):.0f}"]
        raw = [mean("smsp__average_warp_latency_issue_stalled_" + s + ".pct") for s in stalls]
        cells += [f"{100 * v / max(sum(raw), 1e-30):.0f}" for v in raw]
        print("| " + " | ".join(cells) + " |")
    print(f"\nsum of mean kernel times: {total:.1f} µs (kernels traced: {len(data)}); "
          f"units: {units[col['gpu__time_duration.sum']]}, {units[col['dram__bytes.sum.per_second']]}")


if __name__ == "__main__":
    main(sys.argv[1])
