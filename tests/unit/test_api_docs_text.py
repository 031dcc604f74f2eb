"""The API docs show placeholders such as ``<your-token>`` (issue 25).

Swagger UI renders every description as Markdown with inline HTML allowed and then
sanitised, so a bare ``<token>`` is a tag and disappears (the page showed
``Authorization: Token '``). markdown-it (CommonMark, html on) stands in for it here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from markdown_it import MarkdownIt

pytestmark = pytest.mark.django_db

MD = MarkdownIt("commonmark", {"html": True})


def descriptions(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every ``description`` (and the title) in the schema, with its JSON path."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "title") and isinstance(value, str):
                yield f"{where}.{key}", value
            else:
                yield from descriptions(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from descriptions(value, f"{where}[{i}]")


@pytest.fixture(scope="module")
def schema(django_db_blocker: Any) -> dict[str, Any]:
    with django_db_blocker.unblock():
        response = Client().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def test_the_api_description_shows_the_token_placeholder(schema: dict[str, Any]) -> None:
    rendered = MD.render(schema["info"]["description"])
    assert "<code>Authorization: Token &lt;your-token&gt;</code>" in rendered


def test_the_401_response_shows_the_placeholder_too(schema: dict[str, Any]) -> None:
    text = schema["paths"]["/api/v1/brokers/"]["get"]["responses"]["401"]["description"]
    assert "Token &lt;your-token&gt;" in MD.render(text)


def test_no_description_holds_raw_html_that_the_page_would_eat(schema: dict[str, Any]) -> None:
    eaten = [
        (where, token.content)
        for where, text in descriptions(schema)
        for block in MD.parse(text)
        for token in [block, *(block.children or [])]
        if token.type in ("html_inline", "html_block")
    ]
    assert eaten == []


def test_the_docs_page_is_swagger_ui_over_this_schema() -> None:
    page = Client().get("/api/v1/docs/")
    assert page.status_code == 200
    assert b"/api/v1/schema/" in page.content and b"swagger-ui" in page.content
