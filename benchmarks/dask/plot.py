"""Plot the Dask benchmark JSON files as PNGs.

    python benchmarks/dask/plot.py benchmarks/results/dask_comm_vm.json benchmarks/results/dask_apps_vm.json
    python benchmarks/dask/plot.py benchmarks/results/dask_gpu_apps_1xh200.json \
        benchmarks/results/dask_gpu_comm_1xh200.json

Writes ``<name>.png`` next to each JSON file.
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"mpi": "tab:blue", "tcp": "tab:orange"}


def plot_comm(report, path):
    fig, (ax_lat, ax_bw) = plt.subplots(1, 2, figsize=(11, 4.2))
    for protocol, rows in report["results"].items():
        sizes = [r["bytes"] for r in rows]
        ax_lat.loglog(sizes, [r["latency_us"] for r in rows], "o-", label=f"{protocol}://",
                      color=COLORS.get(protocol))
        ax_bw.loglog(sizes, [r["throughput_MBps"] for r in rows], "o-", label=f"{protocol}://",
                     color=COLORS.get(protocol))
    ax_lat.set(xlabel="message size (bytes)", ylabel="one-way latency (us)",
               title="Dask Comm ping-pong latency")
    ax_bw.set(xlabel="message size (bytes)", ylabel="throughput (MB/s)",
              title=f"Dask Comm throughput (window {report['settings']['window']})")
    for ax in (ax_lat, ax_bw):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    machine = report["machine"]
    fig.suptitle(f"{machine['hostname']} ({machine['cpu_count']} CPUs), {report['date'][:10]}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_apps(report, path):
    apps = sorted({a for r in report["runs"] for a, v in r["apps"].items() if isinstance(v, dict)})
    fig, axes = plt.subplots(1, len(apps), figsize=(5.5 * len(apps), 4.2), squeeze=False)
    for ax, app in zip(axes[0], apps):
        for protocol in ("mpi", "tcp"):
            rows = sorted((r["workers"], r["apps"][app]["seconds"]) for r in report["runs"]
                          if r["protocol"] == protocol and isinstance(r["apps"].get(app), dict))
            if rows:
                ax.plot(*zip(*rows), "o-", label=f"{protocol}://", color=COLORS[protocol])
        ax.set(xlabel="workers", ylabel="seconds (median)", title=app)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    machine = report["machine"]
    fig.suptitle(f"Dask applications, {machine['hostname']} ({machine['cpu_count']} CPUs), "
                 f"{report['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_layouts(report, path):
    """Bars per block layout: tcp://, mpi:// with device frames staged, mpi:// with CUDA IPC."""
    bars = (("tcp_ipc1048576", "tcp://", "tab:orange"), ("mpi_ipc0", "mpi:// staged", "tab:cyan"),
            ("mpi_ipc1048576", "mpi:// CUDA IPC", "tab:blue"))
    apps = list(report["summary"])
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.26
    for j, (key, label, color) in enumerate(bars):
        values = [report["summary"][app][key]["best_median_seconds"] * 1e3 for app in apps]
        spots = ax.bar([i + (j - 1) * width for i in range(len(apps))], values, width, label=label, color=color)
        ax.bar_label(spots, fmt="%.0f", fontsize=8)
    ax.set_xticks(range(len(apps)), [f"{app}\n({report['summary'][app]['mpi_ipc0']['bytes_moved_per_run'] / 1e6:.0f} MB "
                                     "moved per run)" for app in apps])
    ax.set(ylabel="ms (median of 5, best of 2 launches)", title="CuPy (x + x.T).sum(), 2 Dask workers, one H200")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.suptitle(f"{report['machine']['kind']}, {report['date'][:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(paths):
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        png = os.path.splitext(path)[0] + ".png"
        plot = plot_comm if "results" in report else plot_layouts if "summary" in report else plot_apps
        plot(report, png)
        print("wrote", png)


if __name__ == "__main__":
    main(sys.argv[1:])
