"""The schema suite of chapter 1: realistic JSON schemas (pydantic models, whose string fields carry the
``examples`` the sampler draws from) and regexes (``outlines.types``), each with a sampler of valid outputs."""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, Field

#: Whitespace patterns compared in the chapter: outlines' default (an optional space between JSON tokens), none.
WHITESPACE = {"default": None, "compact": ""}
#: ``json.dumps`` separators that produce text matching each whitespace pattern.
SEPARATORS = {"default": (", ", ": "), "compact": (",", ":")}


class WeatherArgs(BaseModel):
    location: str = Field(examples=["Paris", "San Francisco, CA", "Tokyo", "Berlin", "Cape Town"])
    unit: Literal["celsius", "fahrenheit"]


class WeatherCall(BaseModel):
    """An OpenAI-style function call with a fixed name."""

    name: Literal["get_weather"]
    arguments: WeatherArgs


class SearchFlights(BaseModel):
    tool: Literal["search_flights"]
    origin: str = Field(pattern=r"^[A-Z]{3}$", examples=["SFO", "JFK", "LHR", "CDG", "NRT", "SIN"])
    destination: str = Field(pattern=r"^[A-Z]{3}$", examples=["SFO", "JFK", "LHR", "CDG", "NRT", "SIN"])
    date: dt.date
    passengers: int = Field(ge=1, le=9)


class BookHotel(BaseModel):
    tool: Literal["book_hotel"]
    city: str = Field(examples=["Lisbon", "Kyoto", "New York", "Reykjavik"])
    check_in: dt.date
    nights: int = Field(ge=1, le=21)


class ToolCall(BaseModel):
    """One call to either of two tools (a union the model chooses between)."""

    call: Union[SearchFlights, BookHotel]


class Address(BaseModel):
    street: str = Field(examples=["12 Rue de Rivoli", "221B Baker Street", "1600 Amphitheatre Parkway"])
    city: str = Field(examples=["Paris", "London", "Mountain View", "Montreal"])
    postal_code: str = Field(pattern=r"^[0-9]{5}$", examples=["75001", "94043", "10115", "30301"])
    country: Literal["FR", "GB", "US", "CA", "DE"]


class UserProfile(BaseModel):
    """A nested object."""

    id: int = Field(ge=1, le=99999)
    name: str = Field(examples=["Alice Martin", "Bob Li", "Chidi Okafor", "Dana Kim"])
    is_active: bool
    address: Address


class TicketTriage(BaseModel):
    """Only enums and a boolean: a classification task."""

    category: Literal["billing", "technical", "account", "shipping", "other"]
    priority: Literal["low", "medium", "high", "urgent"]
    sentiment: Literal["positive", "neutral", "negative"]
    needs_human: bool


class Item(BaseModel):
    name: str = Field(examples=["apples", "oat milk", "rice", "coffee beans", "eggs"])
    quantity: int = Field(ge=1, le=12)
    unit: Literal["pcs", "kg", "l", "pack"]


class ShoppingList(BaseModel):
    """An array of objects."""

    store: str = Field(examples=["corner shop", "Trader Joe's", "market"])
    items: list[Item] = Field(min_length=1, max_length=4)


class Product(BaseModel):
    """Numbers of both kinds."""

    sku: str = Field(pattern=r"^[A-Z]{2}-[0-9]{4}$", examples=["AB-1234", "XY-0042", "QZ-9001"])
    name: str = Field(examples=["USB-C cable", "desk lamp", "noise cancelling headphones", "mug"])
    price: float = Field(ge=0, le=2000)
    quantity: int = Field(ge=0, le=500)
    in_stock: bool


class CalendarEvent(BaseModel):
    """Dates, times and a list of free strings."""

    title: str = Field(examples=["Team sync", "Dentist", "Quarterly planning", "Lunch with Sam"])
    date: dt.date
    start: dt.time
    duration_minutes: int = Field(ge=5, le=480)
    attendees: list[str] = Field(max_length=4, examples=[["Alice", "Bob"], ["Carol"], ["Dan", "Eve", "Frank"]])


class ArticleSummary(BaseModel):
    """Mostly free text: the hardest case for compression."""

    title: str = Field(examples=["Rust in the Linux kernel", "A new battery chemistry", "City budget approved"])
    summary: str = Field(examples=[
        "The council approved next year's budget after a long debate about transit funding.",
        "Researchers report a sodium-ion cell that keeps most of its capacity after 5000 cycles.",
        "Kernel maintainers merged the first drivers written in Rust, with more planned this year.",
    ])
    keywords: list[str] = Field(max_length=5, examples=[["budget", "transit"], ["battery", "sodium"], ["rust"]])
    sentiment: Literal["positive", "neutral", "negative"]


@dataclass
class SuiteEntry:
    """A suite schema (``schema``) or regex (``pattern``); ``sampler(rng, ws)``, if given, returns a valid output."""

    name: str
    kind: Literal["json", "regex"]
    schema: Optional[dict] = None
    pattern: Optional[str] = None
    sampler: Optional[Callable[[random.Random, str], str]] = field(default=None, repr=False)

    def regex(self, whitespace: str = "default", *, ascii_digits: bool = True) -> str:
        """The regex outlines builds for this entry; ``ascii_digits`` writes ``\\d`` as ``[0-9]``."""
        from studylog.fsm.automaton import ascii_digit_classes, regex_from_schema

        if self.kind == "regex":
            return ascii_digit_classes(self.pattern) if ascii_digits else self.pattern
        return regex_from_schema(self.schema, whitespace_pattern=WHITESPACE[whitespace], ascii_digits=ascii_digits)

    def sample(self, rng: random.Random, whitespace: str = "default") -> str:
        if self.sampler is not None:
            return self.sampler(rng, whitespace)
        obj = sample_instance(self.schema, rng)
        return json.dumps(obj, separators=SEPARATORS[whitespace], ensure_ascii=True)


def _random_date(rng: random.Random) -> str:
    return (dt.date(2020, 1, 1) + dt.timedelta(days=rng.randrange(3000))).isoformat()


def sample_instance(schema: dict, rng: random.Random, root: Optional[dict] = None) -> Any:
    """A random instance of the subset of JSON schema the suite uses (objects with every property
    present in schema order, arrays, enums, consts, anyOf, dates/times, strings with examples, numbers, booleans)."""
    root = root if root is not None else schema
    node = schema
    while "$ref" in node:
        if not node["$ref"].startswith("#/$defs/"):
            raise ValueError(f"sampler only follows local $defs references, got {node['$ref']!r}")
        node = root["$defs"][node["$ref"].split("/")[-1]]
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return rng.choice(node["enum"])
    if "anyOf" in node:
        return sample_instance(rng.choice(node["anyOf"]), rng, root)
    kind = node.get("type")
    if kind == "object":
        return {k: sample_instance(v, rng, root) for k, v in node.get("properties", {}).items()}
    if kind == "array":
        if "examples" in node:
            return list(rng.choice(node["examples"]))
        lo = node.get("minItems", 0)
        hi = node.get("maxItems", lo + 3)
        return [sample_instance(node["items"], rng, root) for _ in range(rng.randint(lo, hi))]
    if kind == "string":
        fmt = node.get("format")
        if fmt == "date":
            return _random_date(rng)
        if fmt == "time":
            return f"{rng.randrange(24):02d}:{rng.choice([0, 15, 30, 45]):02d}:00"
        if "examples" not in node:
            raise ValueError(f"give the suite's string fields some examples: {node}")
        return rng.choice(node["examples"])
    if kind == "integer":
        return rng.randint(node.get("minimum", 0), node.get("maximum", 100))
    if kind == "number":
        return round(rng.uniform(node.get("minimum", 0), node.get("maximum", 100)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    raise ValueError(f"the suite's sampler does not handle this schema node: {node}")


def _regex_entries() -> list[SuiteEntry]:
    from outlines.types import dsl
    import outlines.types as ot

    sql = ("SELECT " + dsl.either("name", "email", "age", "city") + " FROM users WHERE "
           + dsl.either("id", "age") + " = " + dsl.Regex("[1-9][0-9]{0,3}") + ";")
    return [
        SuiteEntry("ipv4", "regex", pattern=dsl.to_regex(ot.ipv4), sampler=lambda rng, _ws: ".".join(
            str(rng.choice([rng.randrange(256), rng.randrange(10), 192, 10])) for _ in range(4))),
        SuiteEntry("datetime", "regex", pattern=dsl.to_regex(ot.datetime), sampler=lambda rng, _ws: (
            f"{_random_date(rng)} {rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}")),
        SuiteEntry("us_phone", "regex", pattern=dsl.to_regex(dsl.Regex(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}")),
                   sampler=lambda rng, _ws: f"({rng.randrange(200, 999)}) {rng.randrange(200, 999)}-"
                                            f"{rng.randrange(10000):04d}"),
        SuiteEntry("sql_query", "regex", pattern=dsl.to_regex(sql), sampler=lambda rng, _ws: (
            f"SELECT {rng.choice(['name', 'email', 'age', 'city'])} FROM users WHERE {rng.choice(['id', 'age'])} = "
            f"{rng.randrange(1, 5000)};")),
    ]


@functools.cache
def _model_schemas() -> tuple[tuple[str, str], ...]:
    """The pydantic models' JSON schemas, as text: pydantic builds each in about a millisecond, and the suite is
    read thousands of times by the book and the tests."""
    models = {"weather_call": WeatherCall, "tool_call": ToolCall, "user_profile": UserProfile,
              "ticket_triage": TicketTriage, "shopping_list": ShoppingList, "product": Product,
              "calendar_event": CalendarEvent, "article_summary": ArticleSummary}
    return tuple((name, json.dumps(m.model_json_schema())) for name, m in models.items())


def suite() -> list[SuiteEntry]:
    """The chapter's suite: 9 JSON schemas and 4 regexes (each call returns fresh entries: a caller may edit one)."""
    classifier = SuiteEntry("classifier", "json", schema={"type": "string", "enum": ["true", "false", "NA"]},
                            sampler=lambda rng, _ws: json.dumps(rng.choice(["true", "false", "NA"])))
    return ([classifier] + [SuiteEntry(name, "json", schema=json.loads(text)) for name, text in _model_schemas()]
            + _regex_entries())


def entry(name: str) -> SuiteEntry:
    """One suite entry by name."""
    for e in suite():
        if e.name == name:
            return e
    raise KeyError(f"no suite entry {name!r}; choose from {[e.name for e in suite()]}")
