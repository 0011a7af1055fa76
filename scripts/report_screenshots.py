"""Build the analyze report page of the 8-rank DLRM traces and screenshot it.

    python scripts/report_screenshots.py [TRACES_DIR] [--out docs/images]

writes ``analyze_report.png`` (the page's top: the lead on collectives, the
header, the wait heat map) and ``analyze_utilization.png`` (the utilization heat map) for
the README and docs.  The browser is Debian's ``chromium`` driven by
Playwright (``pip install -e '.[dev]'``); the tests open pages the same way
(:func:`browser`, :func:`open_report`).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("STREAMTRACE_CHROMIUM", "/usr/bin/chromium")
# headless, and nothing that calls a Google host (updates, sync, field trials, QUIC probes)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--disable-extensions", "--metrics-recording-only"]
VIEWPORT = {"width": 1400, "height": 1000}
FIGURE_DATA = """() => Array.from(document.querySelectorAll("div.figure")).map(div => ({
  id: div.id,
  svgs: div.querySelectorAll(".main-svg").length,
  bars: div.querySelectorAll(".bars path").length,
  images: div.querySelectorAll(".hm image").length,
  traces: (div._fullData || []).map(trace => ({
    type: trace.type, name: trace.name,
    x: trace.x ? Array.from(trace.x) : null, y: trace.y ? Array.from(trace.y) : null,
    z: trace.z ? Array.from(trace.z, row => Array.from(row)) : null,
    customdata: trace.customdata ? Array.from(trace.customdata) : null})),
}))"""


@contextmanager
def browser() -> Iterator[object]:
    """A headless Chromium (the system's; Playwright gives it a fresh profile)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def open_report(chromium: object, path: Path, screenshots: dict[str, Path] | None = None) -> dict:
    """Open a report page; returns what the tests check: console errors,
    requests, seconds until every figure is drawn, each figure's data as
    plotly holds it, the lead, call-outs and 'missing' notes, the tables' cells.  ``screenshots``:
    element selector (or "page") -> PNG path."""
    page = chromium.new_page(viewport=VIEWPORT)  # type: ignore[attr-defined]
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: requests.append(request.url))
    started = time.perf_counter()
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-rendered]", timeout=60_000)
    seconds = time.perf_counter() - started
    found = {
        "errors": errors, "requests": [url for url in requests if url != path.resolve().as_uri()], "seconds": seconds,
        "figures": {figure["id"][len("fig-"):]: figure for figure in page.evaluate(FIGURE_DATA)},
        "texts": page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
            "p.callout, p.missing, p.lead")).map(p => [p.id, p.textContent]))"""),
        "tables": page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll("table.data")).map(
            table => [table.id, Array.from(table.rows, row => Array.from(row.cells, cell => cell.textContent))]))"""),
        "facts": page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
            "table.facts tr")).map(tr => [tr.cells[0].textContent, tr.cells[1].textContent]))"""),
    }
    for selector, target in (screenshots or {}).items():
        if selector == "page":
            page.screenshot(path=str(target), clip={"x": 0, "y": 0, **VIEWPORT, "height": 1700})
        else:
            page.locator(selector).screenshot(path=str(target))
    page.close()
    return found


def build_dlrm_page(traces: Path, page: Path) -> dict:
    """The DLRM report page (and the analyze summary it shows)."""
    sys.path.insert(0, str(ROOT))
    import streamtrace

    command = f"streamtrace analyze {traces.name}/ --html {page.name}"
    return streamtrace.analyze(traces, html=str(page), command=command, overwrite=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("STREAMTRACE_TRACES", ROOT.parent / "shared" / "traces")) / "dlrm_8ranks"
    parser.add_argument("traces", nargs="?", type=Path, default=default)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        page = Path(work) / "report.html"
        build_dlrm_page(args.traces, page)
        shots = {"page": args.out / "analyze_report.png", "#fig-utilization": args.out / "analyze_utilization.png"}
        with browser() as chromium:
            found = open_report(chromium, page, shots)
    if found["errors"] or found["requests"]:
        raise SystemExit(f"the page is not clean: {found['errors']} {found['requests']}")
    for target in shots.values():
        print(f"wrote {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")


if __name__ == "__main__":
    main()
