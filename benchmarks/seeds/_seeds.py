"""What the seed scripts 001-003 share: the record every result carries and the README row each prints.

Every JSON holds the machine, the date (UTC), the command that made it, the rank count and device,
``document`` (the figure the source document reports and what it measured), ``peer`` (what we ran
beside our code in the same run) and the ratios; the script prints the README row at the end.
"""

import datetime
import json
import math
import os
import shlex
import sys


def machine(comm=None):
    """Host, cores, MPI library and GPUs (``mpiml.bench._common.machine_info``)."""
    from mpiml.bench._common import machine_info

    return machine_info(comm)


def stamp(ranks=None, launcher="mpiexec"):
    """``date`` (UTC) and ``command``: how this run was started (under ``launcher -n ranks`` if given)."""
    cmd = shlex.join([os.path.basename(sys.executable), *sys.argv])
    if ranks is not None:
        cmd = f"{launcher} -n {ranks} {cmd}"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": cmd}


def ratio(a, b):
    """``a / b``, or None when either is missing, not finite or ``b`` is not positive."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def fmt(x, spec=".2f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def write_json(result, path):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"wrote {path}", flush=True)


def readme_row(cells):
    """Print one Markdown table row (the line the README's table takes for this run)."""
    line = "| " + " | ".join(str(c) for c in cells) + " |"
    print("README row: " + line, flush=True)
    return line


def plot_file(path, draw):
    """``draw(plt)`` -> figure saved at ``path`` (Agg backend); a missing matplotlib is reported, not raised."""
    if not path:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot: matplotlib is not installed ({path})", flush=True)
        return
    fig = draw(plt)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
