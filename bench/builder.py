"""Builder benchmark: the visual builder in Debian's Chromium (Playwright) against a real server on loopback.

    python -m bench.builder [--loads 5] [--nodes 200] [--opens 3] [--runs 5] [--database-url postgres://...] [--json]

Starts the site under gunicorn on a free port of 127.0.0.1 over a scratch database with the demo
workflow and a staff user, builds nothing (run `scripts/build_frontend.sh` first), and measures:

- first load: from navigation to interactive (the palette and the workflow's nodes drawn and the next
  frame painted, in a new browser context each time, so nothing is cached), median of --loads; and the
  JavaScript the page loads, gzipped (what a first visit transfers);
- a workflow of --nodes nodes (a chain of recall nodes between identify_user and remember): opening it
  (navigation until every node is drawn and the next frame painted, so the work that measures the nodes
  after they appear counts too), median of --opens, each in a new context; saving an edit (from the Save
  click to the page saying saved, timed in the page) and opening it again as saved (with the viewport
  the save kept, as an operator reopens it), median of --opens; and the CPU time the page's main thread
  spent on each open (Chromium's ThreadTime metric, over the opens and reopens), which shows a change
  on a busy machine where wall times swing;
- a run streamed with the offline responder: from the `run_started` event to the first node event,
  as the page receives them (performance marks), median of --runs.
"""

import argparse
import asyncio
import gzip
import json
import os
import statistics
import subprocess

from rich.console import Console
from rich.table import Table

from .support.scratch import REPO, add_scratch_arguments, machine_reference, scratch_django
from .support.servers import free_port, server_log, start_server, wait_until_serving

PASSWORD = "bench operator password"
BUILD = REPO / "workflows" / "static" / "workflows" / "builder"
TARGETS = {
    "load_ms": 1500,
    "js_gzip_kb": 400,
    "open_ms": 1000,
    "save_ms": 1000,
    "reopen_ms": 1000,
    "first_event_ms": 100,
}

# Resolves once the page has painted a frame after what it is doing now (its main thread is free again).
PAINTED = "new Promise(resolve => requestAnimationFrame(() => setTimeout(resolve, 0)))"
# Times a save in the page (Playwright's own round trips are not the page's): from the Save button's
# click to the save state reading "saved ·".
TIME_SAVE = """() => new Promise(resolve => {
  const button = [...document.querySelectorAll('button')].find(b => b.textContent === 'Save');
  let clicked = null;
  button.addEventListener('click', () => { clicked = performance.now(); }, { capture: true, once: true });
  const state = document.querySelector('[data-testid=save-state]');
  new MutationObserver((_, observer) => {
    if (clicked !== null && state.textContent.startsWith('saved ·')) { observer.disconnect(); resolve(performance.now() - clicked); }
  }).observe(state, { childList: true, characterData: true, subtree: true });
  window.__engramSaveTimer = true;
})"""


def js_gzip_kb():
    """The builder's JavaScript, each file gzipped (level 9), in KB."""
    files = sorted((BUILD / "assets").glob("*.js"))
    if not files:
        raise SystemExit("no build in workflows/static/workflows/builder/: run scripts/build_frontend.sh first")
    return sum(len(gzip.compress(f.read_bytes(), 9)) for f in files) / 1024


def big_definition(nodes):
    """identify_user -> recall x (nodes - 2) -> remember, laid out in rows of 20."""
    ids = ["identify_user", *[f"recall_{i}" for i in range(1, nodes - 1)], "remember"]
    types = ["identify_user", *["recall"] * (nodes - 2), "remember"]
    return {
        "nodes": [
            {"id": i, "type": t, "config": {}, "position": {"x": (n % 20) * 260, "y": (n // 20) * 200}}
            for n, (i, t) in enumerate(zip(ids, types, strict=True))
        ],
        "edges": [{"source": a, "target": b} for a, b in zip(["START", *ids], [*ids, "END"], strict=True)],
    }


async def measure(base, loads, nodes, runs, opens):
    from playwright.async_api import async_playwright

    from tests.builder_browser import CHROMIUM, FLAGS, VIEWPORT, log_in, node

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = await log_in(browser, base, "bench", PASSWORD, path="/builder/?workflow=demo")
            state = await page.context.storage_state()
            await page.context.close()

            load_ms = []
            for _ in range(loads):
                context = await browser.new_context(viewport=VIEWPORT, storage_state=state)
                page = await context.new_page()
                await page.goto(f"{base}/builder/?workflow=demo", wait_until="commit")
                await page.wait_for_selector(f"{node('remember')} .step-head")
                await page.wait_for_selector(".palette-item")
                await page.evaluate(PAINTED)
                load_ms.append(await page.evaluate("performance.now()"))
                if os.environ.get("BENCH_BUILDER_TRACE"):
                    print(
                        await page.evaluate(
                            "performance.getEntriesByType('resource').map(r => [r.name.slice(-40), Math.round(r.startTime), Math.round(r.duration)])"
                            ".concat([['nav', 0, Math.round(performance.getEntriesByType('navigation')[0].responseEnd)]])"
                        )
                    )
                await context.close()

            async def open_big():
                """A new context opens the big workflow: ms from navigation until it is drawn and painted,
                and the CPU time its page's main thread spent until then (Chromium's own count, which a
                busy machine inflates far less than the wall time)."""
                context = await browser.new_context(viewport=VIEWPORT, storage_state=state)
                page = await context.new_page()
                cdp = await context.new_cdp_session(page)
                await cdp.send("Performance.enable")
                await page.goto(f"{base}/builder/?workflow=big", wait_until="commit")
                await page.wait_for_function(
                    f"document.querySelectorAll('.react-flow__node-step').length === {nodes}", timeout=30_000
                )
                await page.evaluate(PAINTED)
                ms = await page.evaluate("performance.now()")
                metrics = {m["name"]: m["value"] for m in (await cdp.send("Performance.getMetrics"))["metrics"]}
                cpu_ms.append(metrics["ThreadTime"] * 1000)
                return page, ms

            # Opens before the save: the workflow as the server made it (fitted to the canvas on opening);
            # the last one's page makes the edit.
            open_ms, cpu_ms = [], []
            for n in range(opens):
                page, ms = await open_big()
                open_ms.append(ms)
                if n < opens - 1:
                    await page.context.close()
            await page.locator(f"{node('recall_1')} .step-head").click()
            await page.fill(".inspector .label-field input", "renamed")
            await page.wait_for_selector("[data-testid=save-state]:has-text('unsaved')")
            await page.evaluate(PAINTED)
            timing = asyncio.ensure_future(page.evaluate(TIME_SAVE))
            await page.wait_for_function("window.__engramSaveTimer === true")
            await page.click("button:has-text('Save')")
            await page.wait_for_selector("[data-testid=save-state]:has-text('saved ·')", timeout=30_000)
            save_ms = await timing
            await page.context.close()
            reopen_ms = []
            for _ in range(opens):
                page, ms = await open_big()
                reopen_ms.append(ms)
                await page.context.close()

            context = await browser.new_context(viewport=VIEWPORT, storage_state=state)
            page = await context.new_page()
            await page.goto(f"{base}/builder/?workflow=demo")
            await page.wait_for_selector(f"{node('remember')} .step-head")
            first_event_ms = []
            for n in range(runs):
                await page.evaluate("performance.clearMarks()")
                await page.fill("textarea[aria-label=Message]", f"my favourite number is {n}")
                await page.click(".run-button")
                await page.wait_for_selector("[data-testid=run-result] strong:has-text('succeeded')", timeout=60_000)
                marks = await page.evaluate(
                    "['engram:run_started', 'engram:first_node_event'].map(n => performance.getEntriesByName(n)[0]?.startTime)"
                )
                first_event_ms.append(marks[1] - marks[0])
                await page.fill("textarea[aria-label=Message]", "")
            await context.close()
        finally:
            await browser.close()
    return {
        "load_ms": statistics.median(load_ms),
        "open_ms": statistics.median(open_ms),
        "save_ms": save_ms,
        "reopen_ms": statistics.median(reopen_ms),
        "first_event_ms": statistics.median(first_event_ms),
        "open_cpu_ms": statistics.median(cpu_ms),
        "samples": {
            "load_ms": load_ms,
            "open_ms": open_ms,
            "reopen_ms": reopen_ms,
            "open_cpu_ms": cpu_ms,
            "first_event_ms": first_event_ms,
        },
    }


def run(loads, nodes, runs, opens, workers=1):
    from django.contrib.auth import get_user_model
    from django.db import connections

    from workflows.demo import ensure_demo_workflow
    from workflows.models import Workflow

    ensure_demo_workflow()
    Workflow.objects.create(slug="big", name=f"{nodes} nodes", definition=big_definition(nodes))
    get_user_model().objects.create_user("bench", password=PASSWORD, is_staff=True)
    connections.close_all()
    port = free_port()
    server = start_server(port, workers)
    try:
        wait_until_serving(server, port)
        return asyncio.run(measure(f"http://127.0.0.1:{port}", loads, nodes, runs, opens))
    except Exception:
        print(server_log(server))
        raise
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.log.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.builder", description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=5, help="first loads to time, median (default 5)")
    parser.add_argument("--nodes", type=int, default=200, help="nodes of the large workflow (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="streamed runs to time, median (default 5)")
    parser.add_argument(
        "--opens",
        type=int,
        default=3,
        help="opens of the large workflow to time, before and after the save, median (default 3)",
    )
    add_scratch_arguments(parser, seed=False)
    args = parser.parse_args(argv)
    if min(args.loads, args.runs, args.opens) < 1 or args.nodes < 3:
        parser.error("--loads, --runs and --opens must be positive, --nodes at least 3")
    from tests.builder_browser import missing

    reason = missing()
    if reason:
        raise SystemExit(f"cannot drive the builder: {reason}")
    js_kb = js_gzip_kb()
    os.environ.pop("ENGRAM_CHAT_MODEL", None)  # the offline responder: no network, no model time
    with scratch_django(args.database_url, mode="keyword"):
        from django.db import connection

        database = connection.vendor
        results = run(args.loads, args.nodes, args.runs, args.opens)
    results["js_gzip_kb"] = js_kb
    results.update(nodes=args.nodes, database=database)
    samples = {key: [round(ms, 1) for ms in values] for key, values in results.pop("samples").items()}
    if args.json:
        print(
            json.dumps(
                {**{k: round(v, 1) if isinstance(v, float) else v for k, v in results.items()}, "samples": samples}
            )
        )
        return 0
    table = Table(title=f"The builder in headless Chromium, gunicorn on loopback ({database})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("samples", justify="right")
    rows = [
        ("first load, navigation to interactive (median)", "load_ms", "ms"),
        ("JavaScript, gzipped", "js_gzip_kb", "KB"),
        (f"open a {args.nodes}-node workflow (median)", "open_ms", "ms"),
        (f"save an edit of the {args.nodes}-node workflow", "save_ms", "ms"),
        ("open it again as saved, its viewport kept (median)", "reopen_ms", "ms"),
        ("the page's main-thread CPU per open (median of all)", "open_cpu_ms", "ms"),
        ("run_started -> first node event (median)", "first_event_ms", "ms"),
    ]
    for label, key, unit in rows:
        shown = ", ".join(f"{ms:.0f}" for ms in samples.get(key, []))
        if key not in TARGETS:
            table.add_row(label, f"{results[key]:.1f} {unit}", "", shown)
            continue
        ok = results[key] <= TARGETS[key]
        table.add_row(
            label, f"[{'green' if ok else 'red'}]{results[key]:.1f} {unit}[/]", f"<= {TARGETS[key]} {unit}", shown
        )
    console = Console()
    console.print(table)
    console.print(machine_reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
