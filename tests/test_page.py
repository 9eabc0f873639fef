"""The live DAG page in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `make test` installs when missing) opens `/`, connects with a
tenant's token, follows a workflow submitted through the API, and sees its DAG gain nodes
and turn green. The last screenshot is kept in `test-output/live-dag.png`.

The browser is driven from a thread so that the service keeps answering on the test's
event loop; waits are on the page's own DOM changes (a MutationObserver), not on time.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from test_service import Api, Gate, on_stores

OUTPUT = Path(__file__).resolve().parent.parent / "test-output"

WAIT_JS = """
const [condition, done] = [new Function("return (" + arguments[0] + ")"), arguments[1]];
if (condition()) { done(true); return; }
const observer = new MutationObserver(() => {
  if (condition()) { observer.disconnect(); done(true); }
});
observer.observe(document.body, {subtree: true, childList: true, attributes: true,
                                 characterData: true});
"""
"""Calls back when `condition` (a JavaScript expression) holds, looking at each DOM change."""


def browser() -> webdriver.Chrome:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "the browser test needs Debian's chromium and chromium-driver: `make test` "
            "installs them (apt-get install chromium chromium-driver)"
        )
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,800")
    chrome = webdriver.Chrome(service=DriverService(executable_path=driver), options=options)
    chrome.set_script_timeout(60)  # a cap on each wait, should the page never get there
    return chrome


def wait_for(chrome: webdriver.Chrome, condition: str) -> None:
    assert chrome.execute_async_script(WAIT_JS, condition) is True, condition


def shows(element: str, pattern: str) -> str:
    """A condition: the text of the element with id `element` matches `pattern`."""
    return f"/{pattern}/.test(document.getElementById('{element}').textContent)"


def states(chrome: webdriver.Chrome) -> dict[str, str]:
    nodes = chrome.find_elements(By.CSS_SELECTOR, "#nodes .node")
    return {n.get_attribute("data-task") or "": n.get_attribute("data-state") or "" for n in nodes}


@pytest.mark.parametrize("make_store", ["sqlite"], indirect=True)  # the page, not the store
def test_the_page_draws_a_workflow_as_it_runs(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        chrome = await asyncio.to_thread(browser)
        try:
            await flow(api, chrome)
        finally:
            OUTPUT.mkdir(exist_ok=True)
            await asyncio.to_thread(chrome.save_screenshot, str(OUTPUT / "live-dag.png"))
            await asyncio.to_thread(chrome.quit)

    async def flow(api: Api, chrome: webdriver.Chrome) -> None:
        def on_page(fn: Callable[..., Any], *args: Any) -> Any:
            return asyncio.to_thread(fn, *args)

        await on_page(chrome.get, api.base)
        assert "plait" in chrome.title
        token = chrome.find_element(By.ID, "token")
        await on_page(token.send_keys, "acme-token")
        await on_page(chrome.find_element(By.ID, "connect").click)
        await on_page(wait_for, chrome, shows("status", "connected"))

        spec = {
            "name": "page",
            "inputs": {"topic": "prefix caching"},
            "tasks": [
                {"id": "facts", "agent": "writer", "prompt": "Facts on ${inputs.topic}"},
                {"id": "hold", "function": "gate"},
                {"id": "draft", "agent": "writer", "prompt": "Draft: ${facts}", "after": ["facts"]},
            ],
        }
        status, accepted, _ = await api.call("POST", "/v1/workflows", spec)
        assert status == 202, accepted
        run_id = accepted["id"]
        # The list refreshes on its own; the workflow is chosen from it, as a user would.
        item = f"#runs li[data-id='{run_id}']"
        await on_page(wait_for, chrome, f'document.querySelector("{item}") !== null')
        await on_page(chrome.find_element(By.CSS_SELECTOR, item).click)
        await on_page(
            wait_for,
            chrome,
            "document.querySelectorAll('#nodes .node').length === 3 && "
            "document.querySelector('[data-task=draft]').dataset.state === 'succeeded'",
        )
        assert Gate.reached is not None
        await Gate.reached.wait()
        seen = await on_page(states, chrome)
        assert seen["hold"] == "running" and seen["facts"] == "succeeded", seen
        assert len(chrome.find_elements(By.CSS_SELECTOR, "#edges .edge")) == 1

        # The DAG gains nodes while it runs.
        more = {"tasks": [{"id": "summary", "function": "join", "after": ["draft", "hold"]}]}
        status, added, _ = await api.call("POST", f"/v1/workflows/{run_id}/tasks", more)
        assert status == 200, added
        await on_page(wait_for, chrome, "document.querySelectorAll('#nodes .node').length === 4")
        assert len(chrome.find_elements(By.CSS_SELECTOR, "#edges .edge")) == 3
        assert (await on_page(states, chrome))["summary"] in ("pending", "ready")

        assert Gate.opened is not None
        Gate.opened.set()
        await on_page(
            wait_for,
            chrome,
            "[...document.querySelectorAll('#nodes .node')]"
            ".every((n) => n.dataset.state === 'succeeded')",
        )
        await on_page(wait_for, chrome, shows("title", "succeeded"))
        colours = await on_page(
            chrome.execute_script,
            "return [...document.querySelectorAll('#nodes rect')]"
            ".map((r) => r.getAttribute('fill'))",
        )
        assert set(colours) == {"#6ac47a"}, colours  # all green

        # A task's prompt, output and timing on click.
        await on_page(chrome.find_element(By.CSS_SELECTOR, "[data-task=draft]").click)
        await on_page(wait_for, chrome, shows("detail", "Output"))
        detail = chrome.find_element(By.ID, "detail").text
        assert "Draft: ${facts}" in detail and "Draft: Facts on prefix caching" in detail, detail
        assert "duration" in detail and "writer" in detail

        # A bad spec typed into the page is refused with the field named; nothing breaks.
        box = chrome.find_element(By.ID, "spec")
        await on_page(box.clear)
        bad = {"name": "x", "tasks": [{"id": "a", "agent": "nobody", "prompt": "p"}]}
        await on_page(box.send_keys, json.dumps(bad))
        await on_page(chrome.find_element(By.ID, "submit").click)
        await on_page(wait_for, chrome, shows("submit-error", "."))
        assert "tasks[0].agent" in chrome.find_element(By.ID, "submit-error").text

    on_stores(make_store, body)
