"""Writes assets/data/extraction_documents.json: the chapter's document-to-JSON extraction workload.

Five kinds of document a structured-output service is asked to read (invoices, contact cards, event notices,
product pages, bug reports), five of each, written from the field values below with two phrasings per kind,
and one JSON schema per kind. Most field values stand in the document word for word, as in real extraction;
a few are not copied (a total written as a number, a severity chosen from a list). Run from the repository
root: ``python lab/speculate/make_documents.py``.
"""

import json
from pathlib import Path

S = {"type": "string"}
SCHEMAS = {
    "invoice": {"type": "object", "properties": {
        "invoice_number": S, "date": S, "vendor": S, "customer": S, "description": S, "total": {"type": "number"},
        "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]}},
        "required": ["invoice_number", "date", "vendor", "customer", "description", "total", "currency"]},
    "contact": {"type": "object", "properties": {
        "name": S, "title": S, "company": S, "email": S, "phone": S, "address": S},
        "required": ["name", "title", "company", "email", "phone", "address"]},
    "event": {"type": "object", "properties": {
        "title": S, "date": S, "start_time": S, "venue": S, "address": S, "organizer": S},
        "required": ["title", "date", "start_time", "venue", "address", "organizer"]},
    "product": {"type": "object", "properties": {
        "name": S, "brand": S, "sku": S, "price": {"type": "number"}, "color": S, "material": S},
        "required": ["name", "brand", "sku", "price", "color", "material"]},
    "bug_report": {"type": "object", "properties": {
        "title": S, "component": S, "version": S, "severity": {"type": "string", "enum": ["low", "medium", "high"]},
        "error_message": S, "reporter": S},
        "required": ["title", "component", "version", "severity", "error_message", "reporter"]},
}

INVOICES = [
    ("INV-2024-0317", "2024-03-17", "Northwind Traders Ltd", "Blue Harbor Cafe", "Espresso machine service and descaling", 418.5, "EUR"),
    ("A-88213", "2024-07-02", "Kestrel Office Supply", "Maple Street Dental Clinic", "Printer paper, toner cartridges and binders", 1265.4, "USD"),
    ("2024/1182", "2024-11-28", "Fjord Software AS", "Greenfield Logistics GmbH", "Annual license for route planning software", 9800.0, "EUR"),
    ("INV-77410", "2025-01-09", "Hollis & Grant Electrical", "St. Anne's Primary School", "Replacement of hall lighting with LED panels", 3420.0, "GBP"),
    ("B-00451", "2025-02-21", "Sunrise Bakery Wholesale", "The Corner Deli", "Weekly bread and pastry delivery, February", 736.25, "USD"),
]
CONTACTS = [
    ("Dr. Amelia Ortega", "Head of Research", "Lumen Biotech", "amelia.ortega@lumenbio.com", "+1 617 555 0142", "88 Harbor Way, Boston, MA 02110"),
    ("Kenji Watanabe", "Senior Sales Manager", "Tokai Precision Tools", "k.watanabe@tokai-tools.jp", "+81 3 5555 0198", "2-14-7 Shibaura, Minato-ku, Tokyo"),
    ("Sophie Laurent", "Chief Financial Officer", "Atelier Verre SA", "sophie.laurent@atelierverre.fr", "+33 1 55 55 01 23", "17 Rue des Archives, 75004 Paris"),
    ("Marcus Bell", "IT Support Lead", "Riverside Health Partners", "mbell@riversidehp.org", "(503) 555-0177", "400 SW River Parkway, Portland, OR 97201"),
    ("Priya Natarajan", "Product Designer", "Kite & Key Studio", "priya@kiteandkey.io", "+44 20 5555 0161", "Unit 5, 21 Old Street, London EC1V 9HL"),
]
EVENTS = [
    ("Spring Community Book Fair", "2025-04-12", "10:00", "Elm Grove Public Library", "250 Elm Grove Road, Springfield", "Friends of the Elm Grove Library"),
    ("Intro to Rust Workshop", "2025-05-20", "18:30", "Hackspace North", "12 Mill Lane, Leeds LS1 4AB", "Leeds Rust Meetup"),
    ("Harbor Jazz Night", "2025-06-07", "20:00", "The Lighthouse Hall", "3 Pier Street, Halifax", "Harbor Arts Collective"),
    ("Annual Charity 10K Run", "2025-09-14", "08:15", "Riverside Park", "Riverside Drive and 5th Avenue, Austin", "Austin Runners for Kids"),
    ("Data Privacy Forum 2025", "2025-10-02", "09:00", "Kongresshaus Zurich", "Gotthardstrasse 5, 8002 Zurich", "Swiss Digital Rights Association"),
]
PRODUCTS = [
    ("TrailMaster 45L Hiking Backpack", "Alpine Ridge", "AR-TM45-GRN", 139.0, "forest green", "ripstop nylon"),
    ("Aurora Ceramic Table Lamp", "Lumina Home", "LH-AUR-220", 64.99, "matte white", "glazed ceramic"),
    ("Velocity Pro Running Shoe", "Stride Lab", "SL-VP2-10", 129.95, "electric blue", "engineered mesh"),
    ("Heritage Cast Iron Skillet 26 cm", "Forge & Hearth", "FH-CI-26", 49.5, "black", "cast iron"),
    ("Nimbus Wool Throw Blanket", "Highland Weavers", "HW-NIM-130", 89.0, "heather grey", "merino wool"),
]
BUGS = [
    ("Export to CSV drops the last row", "reporting", "4.2.1", "medium", "IndexError: list index out of range", "dana.k"),
    ("Login page freezes after password reset", "authentication", "2.9.0", "high", "TypeError: Cannot read properties of undefined (reading 'token')", "m.rossi"),
    ("Dark mode toggle resets on reload", "settings UI", "1.14.3", "low", "no error message is shown", "lee_w"),
    ("Upload of files over 2 GB fails", "storage service", "3.0.0-rc2", "high", "413 Request Entity Too Large", "ops-team"),
    ("Search results ignore the date filter", "search API", "5.1.7", "medium", "ValueError: invalid date format '2025-13-01'", "j.park"),
]


def invoice(v, i):
    num, date, vendor, customer, desc, total, cur = v
    sym = {"EUR": "EUR", "USD": "USD", "GBP": "GBP"}[cur]
    if i % 2 == 0:
        return (f"{vendor}\nInvoice {num}\nDate: {date}\nBill to: {customer}\n\n"
                f"Description: {desc}\nAmount due: {total:.2f} {sym}\nPayment within 30 days. Thank you for your business.")
    return (f"Hello, please find below invoice number {num}, issued on {date} by {vendor} to {customer} "
            f"for the following: {desc}. The total amount is {sym} {total:.2f}, payable by bank transfer.")


def contact(v, i):
    name, title, company, email, phone, address = v
    if i % 2 == 0:
        return f"{name}\n{title}\n{company}\n{address}\nPhone: {phone}\nEmail: {email}"
    return (f"Nice meeting you at the conference! I'm {name}, {title} at {company}. You can reach me at {email} "
            f"or call {phone}. Our office is at {address}.")


def event(v, i):
    title, date, time, venue, address, org = v
    if i % 2 == 0:
        return (f"{title}\nJoin us on {date} at {time} at {venue}, {address}. Free entry, all welcome.\n"
                f"Organized by {org}.")
    return (f"{org} invites you to the {title}. When: {date}, doors open at {time}. Where: {venue} "
            f"({address}). Please register in advance.")


def product(v, i):
    name, brand, sku, price, color, material = v
    if i % 2 == 0:
        return (f"{brand} {name}\nSKU: {sku}\nPrice: ${price:.2f}\nColor: {color}\nMaterial: {material}\n"
                "Free shipping on orders over $50.")
    return (f"Meet the {name} from {brand}, made of {material} in a {color} finish. Item {sku}, now only "
            f"${price:.2f}. Order today.")


def bug(v, i):
    title, comp, version, sev, err, reporter = v
    if i % 2 == 0:
        return (f"Bug: {title}\nComponent: {comp}\nVersion: {version}\nReported by: {reporter}\n"
                f"Steps: open the page and repeat the action. The console shows: {err}")
    return (f"Reported by {reporter} against {comp} {version}: {title}. Every time it happens the log says "
            f"\"{err}\". This blocks some users.")


KINDS = {"invoice": (INVOICES, invoice, "invoice"), "contact": (CONTACTS, contact, "contact card"),
         "event": (EVENTS, event, "event notice"), "product": (PRODUCTS, product, "product page"),
         "bug_report": (BUGS, bug, "bug report")}


def main():
    docs = []
    for kind, (rows, write, what) in KINDS.items():
        for i, v in enumerate(rows):
            docs.append({"name": f"{kind}_{i + 1}", "kind": kind, "what": what, "document": write(v, i)})
    out = {"schemas": SCHEMAS, "documents": docs}
    path = Path("assets/data/extraction_documents.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(docs)} documents to {path}")


if __name__ == "__main__":
    main()
