"""The generated reference pages (settings, event fields, output columns) are what the
code makes now: a new setting, field or column without its page fails here, with the
command that writes the pages."""

from __future__ import annotations

import pytest

from stream_export.settings import docs
from tests.support import docs_reference


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_the_committed_reference_page_is_generated_from_the_code(name: str) -> None:
    committed = (docs_reference.REFERENCE / name).read_text()
    assert committed == docs_reference.PAGES[name](), (
        f"docs/reference/{name} is stale: run python -m tests.support.docs_reference"
    )


def test_every_setting_is_in_the_reference() -> None:
    page = (docs_reference.REFERENCE / "settings.md").read_text()
    missing = [s.key for s in docs.settings() if f"| `{s.key}` |" not in page]
    assert missing == []
