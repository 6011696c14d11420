"""Tag listings, bounded: the one reader of a registry's paginated tag list.

Every command that lists a store's tags (``ls``, ``prune``, ``du``,
``absorb``, ``copy``, ``node-features``, a node store's eviction) reads them
through :meth:`~artifactd.stores.base.Store.list_tags`; a registry's
``GET /v2/<repo>/tags/list`` pages are read by :func:`read_tag_pages` alone,
and a layout's ``index.json`` keeps the same :data:`MAX_TAGS` cap
(:func:`check_tag_count`). The registry's answer is hostile input:

* **Origin-checked.** A ``Link: <...>; rel="next"`` is followed only to the
  same scheme, host, port and path (this repository's tag list): a next page
  on another origin is refused with a :class:`StoreError` naming that origin,
  before anything is sent there, so the registry's credentials never leave it.
  The next URL is rebuilt from our own base and the link's query alone.
* **Cycle-free.** A page already read is never read again: a link back to it
  (a page naming itself, two pages naming each other) is an error.
* **Capped.** At most :data:`MAX_TAG_PAGES` pages and :data:`MAX_TAGS` tags,
  all read within :data:`LISTING_DEADLINE_S` seconds (checked before each
  page; each page is itself bounded by the transport's timeouts, retries and
  size cap). Past a bound the listing fails: a partial list is never
  returned, since ``prune`` decides what to delete from it.
* **Validated.** Each page must be a JSON object whose ``tags`` is null or a
  list of strings, each a valid OCI tag; anything else is a
  :class:`StoreError` saying the registry's answer is malformed.

The caps are read when used, so tests may patch them on this module.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

from artifactd.errors import StoreError
from artifactd.format.oci import is_tag
from artifactd.jsontext import json_type

#: The most tags one listing holds (a registry repository or a layout's
#: ``index.json``, whose 64 MiB cap is about as many descriptors).
MAX_TAGS = 200_000
#: The most pages one registry listing reads.
MAX_TAG_PAGES = 1_000
#: How long one registry listing may take, all pages together (seconds).
LISTING_DEADLINE_S = 300.0
#: Tags asked for per page (``?n=``); a registry may answer fewer.
PAGE_SIZE = 1_000

_LINK = re.compile(r"<([^>]*)>([^,<]*)")
_REL = re.compile(r';\s*rel\s*=\s*(?:"([^"]*)"|([^\s;,]+))', re.IGNORECASE)


class Page(NamedTuple):
    """One answer to a tag-list request: its body and its ``Link`` header (None: a 404)."""

    body: bytes
    link: str | None


#: Fetch one page by URL; None when the repository does not exist (404).
Fetch = Callable[[str], Page | None]


def check_tag_count(count: int, where: str) -> None:
    """Raise :class:`StoreError` when a listing of ``where`` holds more than :data:`MAX_TAGS`."""
    if count > MAX_TAGS:
        raise StoreError(
            f"{where}: more than {MAX_TAGS} tags; the listing is refused rather than cut short",
            hint="prune the store (artifactd prune), or split its artifacts over repositories",
        )


def parse_tag_page(body: bytes, where: str) -> list[str]:
    """Return the tags of one tag-list page, or raise :class:`StoreError` for a malformed one."""

    def malformed(why: str) -> StoreError:
        return StoreError(
            f"{where}: the registry's answer to the tag listing is malformed: {why}",
            hint='a registry answers {"name": ..., "tags": [...]}; check what serves this address',
        )

    try:
        doc = json.loads(body)
    except RecursionError:
        raise malformed("it nests too deeply") from None
    except ValueError:
        raise malformed("it is not JSON") from None
    if not isinstance(doc, dict):
        raise malformed(f"a JSON {json_type(doc)}, not an object")
    tags = doc.get("tags")
    if tags is None:
        return []
    if not isinstance(tags, list):
        raise malformed(f'"tags" is a JSON {json_type(tags)}, not a list')
    for tag in tags:
        if not isinstance(tag, str):
            raise malformed(f'"tags" holds a JSON {json_type(tag)}, not a string')
        if not is_tag(tag):
            raise malformed(f"{tag[:80]!a} is not a valid tag")
    return tags


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def next_page(link: str | None, current: str, first: str, where: str) -> str | None:
    """Return the URL of the page after ``current`` that ``link`` names, or None (the last).

    Only a ``rel="next"`` link counts. It must resolve to ``first``'s origin
    and path; the URL returned is ``first``'s with the link's query, so
    nothing else of the link (user info, fragment) is ever used.
    """
    target = None
    for m in _LINK.finditer(link or ""):
        rels = [(r.group(1) or r.group(2) or "").lower().split() for r in _REL.finditer(m.group(2))]
        if any("next" in r for r in rels):
            target = m.group(1).strip()
            break
    if target is None:
        return None
    try:
        resolved = urljoin(current, target)
        origin, ours = _origin(resolved), _origin(first)
    except ValueError:  # an unparsable port or host
        raise StoreError(
            f"{where}: the tag listing's next-page link is not a URL: {target[:120]!a}"
        ) from None
    if origin != ours:
        scheme, host, port = origin
        shown = ascii(f"{scheme}://{host}:{port}"[:200])[1:-1]  # the registry's text, escaped
        raise StoreError(
            f"{where}: the tag listing's next page is on another origin "
            f"({shown}); not followed, so no credential goes there",
            hint="the registry (or something in between) sent a Link header naming another "
            "host; list that registry directly if it is meant",
        )
    parts = urlsplit(resolved)
    if parts.path != urlsplit(first).path:
        raise StoreError(
            f"{where}: the tag listing's next page {parts.path[:120]!a} is not this "
            "repository's tag list; not followed",
        )
    return f"{first.split('?', 1)[0]}?{parts.query}" if parts.query else first.split("?", 1)[0]


def read_tag_pages(fetch: Fetch, first: str, where: str) -> list[str]:
    """Read every page of a tag listing from ``first`` on (module doc); return the tags, sorted.

    A 404 on the first page is an empty listing (no such repository yet).
    """
    start = time.monotonic()
    seen: set[str] = set()
    tags: set[str] = set()
    url: str | None = first
    while url is not None:
        if url in seen:
            raise StoreError(
                f"{where}: the tag listing links back to a page it already read "
                f"({urlsplit(url).query or 'the first page'}): a pagination cycle",
                hint="the registry's Link headers loop; report it to its operator",
            )
        if len(seen) >= MAX_TAG_PAGES:
            raise StoreError(
                f"{where}: the tag listing runs past {MAX_TAG_PAGES} pages ({len(tags)} tags)",
                hint="the registry keeps naming a next page; report it to its operator",
            )
        if seen and time.monotonic() - start > LISTING_DEADLINE_S:
            raise StoreError(
                f"{where}: the tag listing took over {LISTING_DEADLINE_S:g} s "
                f"({len(seen)} pages, {len(tags)} tags)",
                hint="the registry is too slow; try again later",
            )
        seen.add(url)
        page = fetch(url)
        if page is None:
            if len(seen) == 1:
                return []
            raise StoreError(f"{where}: a page of the tag listing is gone (404) mid-listing")
        tags.update(parse_tag_page(page.body, where))
        check_tag_count(len(tags), where)
        url = next_page(page.link, url, first, where)
    return sorted(tags)


__all__ = [
    "LISTING_DEADLINE_S",
    "MAX_TAGS",
    "MAX_TAG_PAGES",
    "PAGE_SIZE",
    "Page",
    "check_tag_count",
    "next_page",
    "parse_tag_page",
    "read_tag_pages",
]
