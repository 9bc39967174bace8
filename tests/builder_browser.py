"""Driving the builder (/builder/) in Debian's Chromium through Playwright, for the e2e tests and bench.builder.

Playwright's own browser downloads cannot work here, so it launches the system's `chromium`
(CHROMIUM_BINARY overrides). The async API runs inside `asyncio.run` of one test, so Django's ORM stays
usable, synchronously, before and after it (the sync API keeps an event loop running in the test's
thread, which Django refuses to run the ORM under).
"""

import asyncio
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILT_INDEX = ROOT / "workflows" / "static" / "workflows" / "builder" / "index.html"
CHROMIUM = os.environ.get("CHROMIUM_BINARY") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-dev-shm-usage",
    "--no-first-run",
]
VIEWPORT = {"width": 1600, "height": 1000}


def missing():
    """Why the builder cannot be driven here (None when it can)."""
    if not Path(CHROMIUM).exists():
        return f"needs Debian's chromium at {CHROMIUM} (scripts/install_browser.sh)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "needs the playwright package (pip install -e '.[dev]')"
    if not BUILT_INDEX.exists():
        return "needs the built builder (cd frontend && npm ci && npm run build)"
    return None


def drive(scenario):
    """Run `await scenario(browser)` with a fresh headless Chromium; returns what it returns."""
    from playwright.async_api import async_playwright

    async def main():
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                return await scenario(browser)
            finally:
                await browser.close()

    return asyncio.run(main())


async def log_in(browser, base_url, username, password, path="/builder/"):
    """A new browser context logged in through the admin's login form; returns its page at `path`."""
    context = await browser.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    await page.goto(f"{base_url}/memories/login/?next={path}")
    await page.fill("input[name=username]", username)
    await page.fill("input[name=password]", password)
    await page.click("input[type=submit]")
    await page.wait_for_url(f"**{path.split('?')[0]}**")
    await page.wait_for_selector(".palette-item")
    return page


def node(node_id):
    return f'.react-flow__node[data-id="{node_id}"]'


async def drag_from_palette(page, type_name, x, y):
    """Drag a node type from the palette onto the canvas at (x, y) of the pane."""
    await page.drag_and_drop(
        f'.palette-item[data-type="{type_name}"]', ".react-flow__pane", target_position={"x": x, "y": y}
    )


async def connect(page, source, source_port, target, target_port):
    """Draw an edge with the mouse, from a node's output port to another's input port."""
    out = page.locator(f'{node(source)} .react-flow__handle.source[data-handleid="{source_port}"]')
    into = page.locator(f'{node(target)} .react-flow__handle.target[data-handleid="{target_port}"]')
    a, b = await out.bounding_box(), await into.bounding_box()
    await page.mouse.move(a["x"] + a["width"] / 2, a["y"] + a["height"] / 2)
    await page.mouse.down()
    await page.mouse.move(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2, steps=8)
    await page.mouse.up()


async def node_position(page, node_id):
    """Where a node stands on the canvas, in the flow's own coordinates (its CSS translate)."""
    return await page.locator(node(node_id)).evaluate(
        "el => { const m = /translate\\(([-\\d.]+)px, *([-\\d.]+)px\\)/.exec(el.style.transform);"
        " return [Math.round(+m[1]), Math.round(+m[2])]; }"
    )


async def select_node(page, node_id):
    await page.locator(f"{node(node_id)} .step-head").click()
    await page.wait_for_selector(f'.inspector[aria-label="Node {node_id}"]')


async def run_message(page, message, timeout=60_000):
    """Run the open workflow with a message from the run panel; returns the run's result text."""
    await page.fill("textarea[aria-label=Message]", message)
    result = page.locator("[data-testid=run-result]")
    await page.click(".run-button")
    await page.wait_for_function(
        "() => { const r = document.querySelector('[data-testid=run-result] strong');"
        " return r && !['starting', 'running'].includes(r.textContent); }",
        timeout=timeout,
    )
    return await result.inner_text()


# The largest distance, in screen pixels, from an edge's end to the side of the handle it meets: the
# node sizes and handle places the canvas gives React Flow up front must match what the page draws.
# Ends outside the canvas are skipped (their nodes, off screen, are not drawn).
EDGE_PORT_GAP = """() => {
  const pane = document.querySelector('.react-flow').getBoundingClientRect();
  const shown = p => p.x > pane.left + 2 && p.x < pane.right - 2 && p.y > pane.top + 2 && p.y < pane.bottom - 2;
  const handles = [...document.querySelectorAll('.react-flow__node .react-flow__handle')].map(h => h.getBoundingClientRect());
  const gap = (point, side) => Math.min(...handles.map(r => Math.hypot((side === 'right' ? r.right : r.left) - point.x, r.top + r.height / 2 - point.y)));
  let worst = 0;
  for (const path of document.querySelectorAll('.react-flow__edge path.react-flow__edge-path')) {
    const matrix = path.getScreenCTM();
    const [start, end] = [0, path.getTotalLength()].map(at => { const p = path.getPointAtLength(at); return new DOMPoint(p.x, p.y).matrixTransform(matrix); });
    if (shown(start)) worst = Math.max(worst, gap(start, 'right'));
    if (shown(end)) worst = Math.max(worst, gap(end, 'left'));
  }
  return worst;
}"""


async def edge_port_gap(page):
    return await page.evaluate(EDGE_PORT_GAP)
