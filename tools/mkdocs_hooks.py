"""MkDocs hook: links from a page to a file of the repository outside docs/.

A page may link a file that the site does not publish
(`[the engine's map](../routerpanel/router/README.md)`): MkDocs would report it as a missing page.
This hook checks that the file exists in the repository (a warning, so `mkdocs build --strict`
fails, when it does not) and shows the link as the file's path, in code, since the site has no
page for it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repository_links")
LINK = re.compile(r"\[([^\]]+)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    here = (docs / page.file.src_path).parent

    def repository_path(match: re.Match[str]) -> str:
        text, target = match.group(1), match.group(2)
        path = (here / target).resolve()
        if path.is_relative_to(docs):
            return match.group(0)  # a page of the site: MkDocs checks it
        if not path.is_relative_to(root) or not path.exists():
            where = page.file.src_path
            log.warning("%s links %s, which is not a file of the repository", where, target)
            return match.group(0)
        shown = path.relative_to(root).as_posix()
        return f"`{shown}`" if text.strip("`") == shown else f"{text} (`{shown}`)"

    return LINK.sub(repository_path, markdown)
