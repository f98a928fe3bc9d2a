"""Real requests for the real model (an instruction, then the schema or the format in words, in the chat template),
and the check that a finished output is what the format asks for."""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from studylog.fsm.schemas import entry as suite_entry

#: Per suite entry, instructions a user might write (a batch cycles through them).
INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "classifier": ("Is this post about a real event? Post: 'Huge fire downtown, roads closed near the station.'",
                   "Is this post about a real event? Post: 'I love my new cat, she sleeps all day.'"),
    "weather_call": ("Get the weather in Paris in celsius.", "What is the weather like in Tokyo? Use fahrenheit."),
    "tool_call": ("Find flights from SFO to JFK on 2025-03-14 for 2 passengers.",
                  "Book a hotel in Lisbon from 2025-06-01 for 3 nights."),
    "user_profile": ("Create a profile for Alice Martin, user 42, active, living at 12 Rue de Rivoli, 75001 Paris, "
                     "France.",
                     "Create a profile for Bob Li, user 7, inactive, at 1600 Amphitheatre Parkway, 94043 Mountain "
                     "View, US."),
    "ticket_triage": ("Triage this ticket: 'I was charged twice for my order and nobody answers my emails!'",
                      "Triage this ticket: 'How do I change the email address on my account?'"),
    "shopping_list": ("Make a shopping list for the market: 6 eggs, 1 kg of rice and 2 packs of coffee beans.",
                      "Shopping list for the corner shop: 1 l of oat milk and 4 apples."),
    "product": ("Describe the product AB-1234, a USB-C cable at 9.99, 120 in stock.",
                "Describe the product XY-0042, a desk lamp at 24.5, none in stock."),
    "calendar_event": ("Schedule a team sync on 2025-05-06 at 09:30 for 30 minutes with Alice and Bob.",
                       "Add a dentist appointment on 2025-02-11 at 14:00, 45 minutes."),
    "article_summary": ("Summarise: 'The city council approved next year's budget after a long debate about "
                        "transit funding. Bus routes will expand in the spring.'",
                        "Summarise: 'Researchers report a sodium-ion cell that keeps most of its capacity after "
                        "5000 cycles, a step toward cheaper storage.'"),
    "ipv4": ("What is the IP address of the local loopback interface?", "Give the IP address 192.168.1.20."),
    "datetime": ("When did the meeting start? It started on March 3rd 2025 at quarter past ten in the morning.",
                 "Write the date and time of noon on the first of January 2024."),
    "us_phone": ("What is the phone number? Call us at 415 555 0132.", "Write the number 212-555-0199."),
    "sql_query": ("Write a query that gets the email of the user with id 17.",
                  "Write a query that gets the city of users aged 30."),
}

#: How a regex entry's format is described to the user (JSON entries show their schema instead).
FORMATS = {
    "ipv4": "an IPv4 address, like 10.0.0.1",
    "datetime": "an ISO 8601 date and time, like 2024-05-01T08:00:00",
    "us_phone": "a US phone number written as (555) 555-5555",
    "sql_query": "one SQL query of the form SELECT <column> FROM users WHERE <column> = <number>;",
}


def message(name: str, variant: int = 0) -> str:
    """The user's message for suite entry ``name`` (its ``variant``-th instruction, cycling)."""
    if name not in INSTRUCTIONS:
        raise ValueError(f"no request for suite entry {name!r}; choose from {sorted(INSTRUCTIONS)}")
    texts = INSTRUCTIONS[name]
    text = texts[variant % len(texts)]
    entry = suite_entry(name)
    if entry.kind == "json":
        return f"{text}\nAnswer with JSON only, following this JSON schema:\n{json.dumps(entry.schema)}"
    return f"{text}\nAnswer with {FORMATS[name]}, and nothing else."


def chat_ids(name: str, tokenizer: Any, variant: int = 0) -> list[int]:
    """The request as the model reads it (``tokenizer``: :func:`studylog.smollm2.tokenizer`)."""
    return tokenizer.encode_chat([{"role": "user", "content": message(name, variant)}])


def batch_ids(name: str, tokenizer: Any, batch: int) -> list[list[int]]:
    """``batch`` requests of one entry (its instructions in turn)."""
    return [chat_ids(name, tokenizer, i) for i in range(batch)]


def valid(name: str, text: bytes | str) -> tuple[bool, str]:
    """Whether a finished output of suite entry ``name`` is what its format asks for: (ok, why not)."""
    entry = suite_entry(name)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            return False, f"not UTF-8: {exc}"
    if entry.kind == "regex":
        ok = re.fullmatch(entry.regex("default"), text) is not None
        return ok, "" if ok else "does not match the pattern"
    return valid_json(text, entry.schema)


def valid_json(text: bytes | str, schema: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``text`` is a JSON document valid for ``schema``: (ok, why not)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return False, f"not JSON: {exc}"
    except jsonschema.ValidationError as exc:
        return False, f"not valid for the schema: {exc.message}"
    return True, ""


def summarize(names: Sequence[str], texts: Sequence[bytes], finished: Sequence[bool]) -> dict[str, Any]:
    """The share that finished within the cap, and of those the share valid, with the reasons of the others."""
    done = [(n, t) for n, t, f in zip(names, texts, finished) if f]
    checks = [(n, *valid(n, t)) for n, t in done]
    return {"requests": len(texts), "finished": len(done), "valid": sum(ok for _, ok, _ in checks),
            "invalid": [(n, why) for n, ok, why in checks if not ok]}

