"""``analyze``'s tables: every analysis asked for combines its ranks' results, and the tables are written."""
from __future__ import annotations

import csv
import io
import math
import os
import shutil

from ...io import report as page
from ...io.destinations import Destinations
from .launches import open_part
from .registry import ANALYSES, columns_of, tables_of
from .spec import RankResult, Run

LAUNCH_TABLE = "kernel_launch_stats"  # its rows are in the ranks' part files (one per launched kernel)


def build_tables(results: list[RankResult], analyses: tuple[str, ...], num_candidates: int,
                 utilization_bins: int) -> dict[str, list[dict] | None]:
    """The tables of these analyses (but the launch rows), in the order written."""
    run = Run(sorted(results, key=lambda result: result.rank), num_candidates, utilization_bins)
    found: dict[str, list[dict]] = {}
    for name in analyses:
        found.update(ANALYSES[name].combine(run))
    return {table: found[table] for table in tables_of(analyses) if table != LAUNCH_TABLE}


def claim_outputs(destinations: Destinations, out_dir: str | os.PathLike | None, html: str | os.PathLike | None,
                  analyses: tuple[str, ...]) -> dict[str, str]:
    """Check and reserve every file the run writes before reading anything: the tables' CSVs, the page."""
    targets: dict[str, str] = {}
    if out_dir is not None:
        directory = destinations.directory(out_dir, writes="the tables' CSV files")
        targets = {name: os.path.join(directory, f"{name}.csv") for name in tables_of(analyses)}
        destinations.claim_all(targets.values(), role="table")
    if html is not None:
        page.require_plotly()
        destinations.claim(html, role="HTML report", holds="HTML")
    return targets


def _csv_value(value: object) -> object:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def write_tables(destinations: Destinations, tables: dict, parts: list[str], targets: dict[str, str]) -> None:
    """One CSV per table (launch statistics copied from the ranks' parts), each through the run's write rules
    (the destinations make the tables' directory, and take it away again if the run fails)."""
    for name, path in targets.items():
        with destinations.open(path, role="table") as raw:
            out = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            columns = columns_of(name)
            csv.writer(out).writerow(columns)
            if name == LAUNCH_TABLE:
                out.flush()
                for part in parts:
                    with open_part(part) as rows:
                        shutil.copyfileobj(rows, raw)
            else:
                csv.writer(out).writerows([_csv_value(row[column]) for column in columns] for row in tables[name])
            out.flush()
            out.detach()  # the stream is the destination's to close
