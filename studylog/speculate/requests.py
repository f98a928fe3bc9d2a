"""The chapter's workload: document-to-JSON extraction, and chapter 7's requests, where little is copied.

``assets/data/extraction_documents.json`` holds 25 documents of five kinds and one JSON schema per kind. A request
puts the document first and the instruction and schema after it: prompt lookup matches the leftmost occurrence of
an n-gram, and the values are in the document."""

from __future__ import annotations

import functools
import json
from typing import Any

from studylog.checks import check_choice
from studylog.decode.requests import valid_json
from studylog.paths import DATA

DOCUMENTS_PATH = DATA / "extraction_documents.json"
#: The chapter 7 entries whose JSON outputs the prompt mostly does not hold (the low-copy side).
LOW_COPY = ("classifier", "ticket_triage", "article_summary", "weather_call", "calendar_event", "shopping_list")


@functools.lru_cache(maxsize=1)
def workload() -> dict[str, Any]:
    """``{"schemas": {kind: schema}, "documents": [{"name", "kind", "what", "document"}, ...]}``."""
    if not DOCUMENTS_PATH.exists():
        raise FileNotFoundError(f"{DOCUMENTS_PATH} is missing: run python lab/speculate/make_documents.py")
    return json.loads(DOCUMENTS_PATH.read_text())


def document_names(kind: str | None = None) -> list[str]:
    """The documents' names (``invoice_1`` ...), of one ``kind`` or all."""
    docs = workload()["documents"]
    kinds = sorted({d["kind"] for d in docs})
    if kind is not None:
        check_choice("kind", kind, kinds)
    return [d["name"] for d in docs if kind is None or d["kind"] == kind]


def document(name: str) -> dict[str, Any]:
    for d in workload()["documents"]:
        if d["name"] == name:
            return d
    raise ValueError(f"no document {name!r}; the documents are {document_names()}")


def schema(name: str) -> dict[str, Any]:
    """The JSON schema of document ``name``'s kind."""
    return workload()["schemas"][document(name)["kind"]]


def message(name: str) -> str:
    """The user's message: the document, then what to extract and the schema."""
    d = document(name)
    return (f"{d['document']}\n\nExtract the fields of this {d['what']} as JSON. Copy the values exactly as they "
            f"are written above. Answer with JSON only, following this JSON schema:\n{json.dumps(schema(name))}")


def chat_ids(name: str, tokenizer: Any) -> list[int]:
    """Request ``name`` as the model reads it (``tokenizer``: :func:`studylog.smollm2.tokenizer`)."""
    return tokenizer.encode_chat([{"role": "user", "content": message(name)}])


def valid(name: str, text: bytes | str) -> tuple[bool, str]:
    """Whether a finished output is a JSON document valid for the request's schema: (ok, why not)."""
    return valid_json(text, schema(name))


__all__ = ["DOCUMENTS_PATH", "LOW_COPY", "chat_ids", "document", "document_names", "message",
           "schema", "valid", "workload"]
