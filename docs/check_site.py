"""Look at the built documentation in a real browser: headless Chromium screenshots the landing page, a tutorial and
an API page (at two desktop widths and a narrow one) into ``docs/_build/screenshots/``, and fails when a code block
runs past its right edge, a figure does not load, or any page of the site scrolls sideways at a desktop width.

Usage: ``python docs/check_site.py [docs/_build/html]`` (``make docs`` runs it after the build). Needs Chromium
(``/usr/bin/chromium``, Debian's package ``chromium``) and the ``playwright`` package.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: The pages looked at, relative to the built site.
PAGES = {
    "landing": "index.html",
    "tutorial": "generated/tutorials/quickstart.html",
    "api": "generated/api/pyro_bbb.infer.elbo.html",
}
#: Viewport widths in pixels: a laptop, a desktop monitor and a narrow window.
WIDTHS = (1280, 1920, 760)
#: The widths every page of the site is measured at for sideways scrolling.
PAGE_WIDTHS = (1280, 1920)
#: Chromium's flags for a machine with no screen and a closed network.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

_OVERFLOWING_CODE = """() => [...document.querySelectorAll('pre')]
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.trim().slice(0, 60))"""
_SIDEWAYS_SCROLL = "() => document.documentElement.scrollWidth - window.innerWidth"
_BROKEN_IMAGES = """() => [...document.images]
    .filter(i => !i.complete || i.naturalWidth === 0)
    .map(i => i.getAttribute('src'))"""


def check(site: Path, out: Path) -> list[str]:
    """Screenshot every page at every width into ``out``; the problems found (empty when all is well)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    problems = []
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for name, relative in PAGES.items():
                path = site / relative
                if not path.exists():
                    problems.append(f"{relative}: not built")
                    continue
                for width in WIDTHS:
                    page = browser.new_page(viewport={"width": width, "height": 900})
                    page.goto(path.resolve().as_uri(), wait_until="load")
                    page.screenshot(path=str(out / f"{name}_{width}.png"), full_page=width == WIDTHS[0])
                    problems += [f"{relative} at {width}px: code block overflows: {text!r}"
                                 for text in page.evaluate(_OVERFLOWING_CODE)]
                    problems += [f"{relative} at {width}px: image does not load: {src}"
                                 for src in page.evaluate(_BROKEN_IMAGES)]
                    if name == "tutorial" and not page.query_selector_all("figure img"):
                        problems.append(f"{relative}: no figure on the tutorial page")
                    page.close()
            problems += _sideways_scrolling(browser, site)
        finally:
            browser.close()
    return problems


def _sideways_scrolling(browser, site: Path) -> list[str]:
    """Every HTML page of the site that is wider than the window at a desktop width (it scrolls sideways)."""
    problems = []
    pages = sorted(p for p in site.rglob("*.html") if "_modules" not in p.parts and "_sources" not in p.parts)
    for width in PAGE_WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": 900})
        for path in pages:
            page.goto(path.resolve().as_uri(), wait_until="load")
            excess = page.evaluate(_SIDEWAYS_SCROLL)
            if excess > 0:
                problems.append(f"{path.relative_to(site)} at {width}px: the page scrolls sideways by {excess}px")
        page.close()
    print(f"check_site: {len(pages)} pages measured for sideways scrolling at {PAGE_WIDTHS} px")
    return problems


if __name__ == "__main__":
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html")
    problems = check(site, site.parent / "screenshots")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"check_site: {len(PAGES)} pages at {len(WIDTHS)} widths, screenshots in {site.parent / 'screenshots'}; "
          f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)
