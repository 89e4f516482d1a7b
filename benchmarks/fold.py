"""Fold a benchmark's runs into its one result file, one key per run (benchmarks/results/ holds at most 40 files).

    python benchmarks/fold.py benchmarks/results/linreg_4xh100.json n1=OUT/linreg_n1_4xh100.json \
        n4=OUT/linreg_n4_4xh100.json --what "LinearRegression at the defaults on 1 and 4 GPUs"

Each ``KEY=FILE`` puts the JSON of FILE under KEY of the result file.  A result file folded before keeps
its other keys (a key given again is replaced: the newer run); a result file that is one run (not
folded yet) is kept under ``--keep-as`` (default ``previous``) unless ``--replace`` drops it.  The
folded file records, under ``folded``, which file each key came from; the docs cite a run as "key
``n4`` of ``benchmarks/results/linreg_4xh100.json``".
"""

import argparse
import json
import os
import sys

MARK = "folded"


def fold(out, runs, what=None, keep_as="previous", replace=False):
    """The folded document: ``out``'s (if it exists) with ``runs`` ({key: path}) under their keys."""
    doc = {}
    if os.path.exists(out) and not replace:
        with open(out) as f:
            old = json.load(f)
        if isinstance(old, dict) and MARK in old:
            doc = old
        else:
            doc = {MARK: {keep_as: os.path.basename(out)}, keep_as: old}
    doc.setdefault(MARK, {})
    for key, path in runs.items():
        if key in ("what", MARK):
            raise ValueError(f"{key!r} is not a run's key")
        with open(path) as f:
            doc[key] = json.load(f)
        doc[MARK][key] = os.path.basename(path)
    if what:
        doc["what"] = what
    # "what" first, then "folded", then the runs in key order as given
    return {k: doc[k] for k in ["what", MARK] if k in doc} | {k: v for k, v in doc.items() if k not in ("what", MARK)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the benchmark's result file (benchmarks/results/<benchmark>_<machine>.json)")
    ap.add_argument("runs", nargs="+", metavar="KEY=FILE")
    ap.add_argument("--what", default=None, help="one sentence: what the file holds, and what each key is")
    ap.add_argument("--keep-as", default="previous", help="the key of a result file that was one run")
    ap.add_argument("--replace", action="store_true", help="start from nothing (drop what the file held)")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        key, sep, path = item.partition("=")
        if not sep or not key or not path:
            ap.error(f"expected KEY=FILE, got {item!r}")
        if not os.path.exists(path):
            ap.error(f"{path}: no such file")
        runs[key] = path
    try:
        doc = fold(args.out, runs, args.what, args.keep_as, args.replace)
    except ValueError as exc:
        ap.error(str(exc))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{args.out}: keys {[k for k in doc if k not in ('what', MARK)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
