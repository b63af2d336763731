"""The API docs (/docs) in a real browser: headless Chromium driven by Selenium against a live server on 127.0.0.1.

A 200 from /docs says nothing about what Swagger UI makes of the schema (Swagger UI 4 answers FastAPI's OpenAPI 3.1
with "Unable to render this definition" and no operation at all), so this reads the rendered page: every operation
of /openapi.json drawn as an operation block, no error, and nothing fetched from anywhere but this server.

Needs Debian's `chromium` and `chromium-driver`, like tests/test_search_page.py."""

from __future__ import annotations

import json
import urllib.request

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.page_screenshot import chromium
from retriever.serve.app import create_app
from retriever.serve.run import serving_in_thread

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
RENDER_ERROR = "Unable to render this definition"


@pytest.fixture()
def browser():
    session = chromium()  # headless, through Debian's chromium-driver
    session.set_page_load_timeout(20)
    try:
        yield session
    finally:
        session.quit()


@pytest.fixture()
def served(tmp_path):
    # No index is needed: the docs describe the API, whatever the folder holds.
    with serving_in_thread(create_app(tmp_path / "indexes", device="cpu"), timeout=20) as url:
        yield url


def rendered_operations(driver) -> set[tuple[str, str]]:
    """(method, path) of each operation block Swagger UI has drawn."""
    found = set()
    for block in driver.find_elements(By.CSS_SELECTOR, ".opblock"):
        methods = block.find_elements(By.CSS_SELECTOR, ".opblock-summary-method")
        paths = block.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
        if methods and paths:
            path = paths[0].get_attribute("data-path") or paths[0].text.replace("\u200b", "")
            found.add((methods[0].text.strip().lower(), path.strip()))
    return found


@pytest.mark.timeout(90)
def test_the_api_docs_render_every_operation_offline(browser, served):
    with urllib.request.urlopen(served + "/openapi.json", timeout=10) as answer:
        schema = json.load(answer)
    expected = {(method, path) for path, item in schema["paths"].items() for method in item
                if method in HTTP_METHODS}
    assert {("get", "/search"), ("post", "/search"), ("get", "/health")} <= expected  # the schema itself is sane

    browser.get(served + "/docs")
    # Swagger UI draws either the operations or its error box; wait for one of them (or the page's own errors).
    WebDriverWait(browser, 15).until(
        lambda driver: RENDER_ERROR in driver.find_element(By.TAG_NAME, "body").text
        or driver.find_elements(By.CSS_SELECTOR, "#swagger-ui .errors-wrapper")
        or rendered_operations(driver) >= expected)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert RENDER_ERROR not in body, body[:500]
    assert not browser.find_elements(By.CSS_SELECTOR, "#swagger-ui .errors-wrapper"), body[:500]
    drawn = rendered_operations(browser)
    assert drawn >= expected, f"operations not rendered: {sorted(expected - drawn)}"
    assert "retriever" in browser.find_element(By.CSS_SELECTOR, "#swagger-ui .info .title").text

    # Offline: every script, style, image and the schema came from this server, none from a CDN.
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(entry => entry.name)")
    assert fetched and any(name.endswith("/openapi.json") for name in fetched), fetched
    assert all(name.startswith(served + "/") or name.startswith("data:") for name in fetched), fetched
