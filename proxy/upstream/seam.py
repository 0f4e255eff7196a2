"""The upstream seam: what requests and the summarizer need of ``UpstreamClient``
(tests put an in-process fake behind it, ``tests/support/fakes.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from yarl import URL

if TYPE_CHECKING:
    from proxy.upstream.response import UpstreamResponse


class Upstream(Protocol):
    async def send(
        self,
        method: str,
        url: str | URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes | AsyncIterator[bytes] | None,
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...
