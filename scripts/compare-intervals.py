#!/usr/bin/env python3
"""compare-intervals.py: do two runs of the same benchmark scenarios agree?

    python3 scripts/compare-intervals.py RUN1_DIR RUN2_DIR E2 E6

Reads <dir>/<scenario>.json as remat_bench --out writes them and pairs every
ratio cell that carries an interval ({median, low, high, ...}) by table, row
and column. Prints, per scenario, how many pairs there are, how many
intervals overlap, the median and largest relative half width of the
intervals, and each pair that does not overlap. Exit status 1 if any pair
does not overlap.
"""
import json
import statistics
import sys


def interval_cells(path):
    with open(path) as f:
        section = json.load(f)
    cells = {}
    for table in section["tables"]:
        for r, row in enumerate(table["rows"]):
            label = row[0] if isinstance(row[0], str) else str(r)
            for c, cell in enumerate(row):
                if isinstance(cell, dict) and "low" in cell and cell.get("has_interval"):
                    if cell["low"] == cell["high"] == 1:
                        continue  # a baseline against itself
                    cells[(table["name"], r, label, table["columns"][c])] = cell
    return cells


def half_width(cell):
    return (cell["high"] - cell["low"]) / 2 / cell["median"] if cell["median"] > 0 else 0.0


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    first, second, scenarios = argv[1], argv[2], argv[3:]
    failed = False
    for scenario in scenarios:
        a = interval_cells(f"{first}/{scenario}.json")
        b = interval_cells(f"{second}/{scenario}.json")
        keys = sorted(set(a) & set(b), key=str)
        widths = [half_width(a[k]) for k in keys] + [half_width(b[k]) for k in keys]
        disjoint = [k for k in keys if a[k]["high"] < b[k]["low"] or b[k]["high"] < a[k]["low"]]
        print(f"{scenario}: {len(keys)} paired intervals, {len(keys) - len(disjoint)} overlap; "
              f"relative half width median {statistics.median(widths) * 100:.1f} %, "
              f"largest {max(widths) * 100:.1f} %" if keys else f"{scenario}: no paired intervals")
        for k in disjoint:
            failed = True
            print(f"  disjoint: {k}: [{a[k]['low']:.3f}, {a[k]['high']:.3f}] vs "
                  f"[{b[k]['low']:.3f}, {b[k]['high']:.3f}]")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
