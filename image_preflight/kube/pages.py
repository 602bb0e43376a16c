"""A paginated list (limit/continue), the one way every command reads a list from the apiserver."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any


class Pages:
    """A list read one page at a time, as its items are consumed; `resource_version` is the
    snapshot's (every page carries it), for a watch to resume from."""

    def __init__(self, list_objects: Callable[..., Any], page_size: int, selectors: dict[str, str] | None = None, *,
                 timeout: tuple[float, float]) -> None:
        self._list_objects = list_objects
        self._selectors = selectors or {}
        self._page_size = page_size
        self._timeout = timeout
        self.resource_version: str | None = None

    def items(self) -> Iterator[dict]:
        token = None
        while True:
            query = {"limit": self._page_size, **({"_continue": token} if token else {})}
            response = self._list_objects(**self._selectors, _preload_content=False, _request_timeout=self._timeout,
                                          **query)
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            metadata = body.get("metadata") or {}
            self.resource_version = metadata.get("resourceVersion")
            token = metadata.get("continue")
            items = body.get("items") or []
            del body  # a page of Nodes can be megabytes: one is held at a time
            yield from items
            del items
            if not token:
                return
