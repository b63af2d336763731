"""A screenshot of the search page for the README: a real index, a real query, headless Chromium.

    python benchmarks/page_screenshot.py --index-dir DIR --index NAME --query "..." [--view modes] [--out FILE.png]

Serves DIR in this process on 127.0.0.1 (`retriever.serve.app.serving_in_thread`), opens the page with the query
and the VIEW (modes: hybrid beside dense and keyword; raw: calibrated beside raw), waits for every column's
ranking, and saves the window.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def chromium(width: int = 1400, height: int = 1000):
    """Headless Chromium through Debian's chromium-driver (the browser test uses the same)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (browser and driver):
        raise SystemExit("needs chromium and chromium-driver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)
    session.set_page_load_timeout(60)
    return session


def main() -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from retriever.serve.app import create_app

    from retriever.serve.run import serving_in_thread

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-dir", type=Path, required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--query", required=True)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--view", default="modes", choices=("modes", "raw", "hybrid", "dense", "keyword"))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "search-page.png")
    args = parser.parse_args()
    with serving_in_thread(create_app(args.index_dir, device="cpu")) as url:
        browser = chromium()
        try:
            last = {"modes": "keyword", "raw": "raw"}.get(args.view, args.view)  # the last column drawn
            browser.get(f"{url}/?{urlencode({'index': args.index, 'q': args.query, 'view': args.view})}")
            WebDriverWait(browser, 120).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, f"#{last}-results li.hit")
                and "results in" in d.find_element(By.ID, "status").text)
            if args.k != 10:  # shorter lists fit the window
                browser.find_element(By.ID, "k").clear()
                browser.find_element(By.ID, "k").send_keys(str(args.k))
                browser.find_element(By.ID, "search").click()
                WebDriverWait(browser, 120).until(
                    lambda d: len(d.find_elements(By.CSS_SELECTOR, f"#{last}-results li.hit")) == args.k)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(args.out))
        finally:
            browser.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
