"""Browser fixtures: one headless chromium per test module (starting one costs about a second),
a Console bound to the test's name for its screenshots."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support.browser import WebhookReceiver, _slug, chrome


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    d = chrome()
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture
def test_name(request: pytest.FixtureRequest) -> str:
    return _slug(request.node.name.removeprefix("test_"))


@pytest.fixture
def webhook_receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver
