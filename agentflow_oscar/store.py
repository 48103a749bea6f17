"""The store's state: a migrated, loaded SQLite template built once, restored before every episode.

``build`` runs Oscar's migrations and loads ``catalogue.json`` through Oscar's own models; the result is
copied to a template file in a cache directory keyed by the fixture and the installed Oscar and Django
versions, so only the first start pays for the migrations. ``restore`` copies the template over the live
database with SQLite's online backup (safe while the server holds the file) and ``apply_scenario`` sets
what a variant changes in the store (stock of the featured product, prices, whether the customer's
account is active). ``placed_order`` reads the last order back from Oscar's tables.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from importlib import metadata
from pathlib import Path
from typing import Any

CATALOGUE_FILE = Path(__file__).resolve().parent / "catalogue.json"
CENT = Decimal("0.01")


def catalogue() -> dict[str, Any]:
    """The catalogue fixture (plain data)."""
    data: dict[str, Any] = json.loads(CATALOGUE_FILE.read_text(encoding="utf-8"))
    return data


def template_key() -> str:
    """What the template depends on: the fixture and the installed Oscar and Django."""
    digest = hashlib.sha256(CATALOGUE_FILE.read_bytes())
    for package in ("django-oscar", "django"):
        digest.update(f"{package}=={metadata.version(package)}".encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """Where templates are kept: ``AGENTFLOW_OSCAR_CACHE`` or ``~/.cache/agentflow/oscar``."""
    return Path(os.environ.get("AGENTFLOW_OSCAR_CACHE") or Path.home() / ".cache" / "agentflow" / "oscar")


def copy_database(source: Path, target: Path) -> None:
    """Copy one SQLite database onto another with the online backup API (consistent while either is open)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def build(live_db: Path) -> None:
    """Migrate ``live_db`` (Django is set up on it) and load the catalogue fixture."""
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    load_catalogue(catalogue())


def ensure_template(live_db: Path, cache_dir: Path) -> Path:
    """The template for the current key (built on ``live_db`` and saved under a lock if missing)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    template = cache_dir / f"oscar-{template_key()}.sqlite3"
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            from django.db import connections

            connections.close_all()
            live_db.unlink(missing_ok=True)  # the build starts from an empty database
            build(live_db)
            partial = template.with_suffix(".partial")
            copy_database(live_db, partial)
            partial.replace(template)
    return template


def restore(template: Path, live_db: Path) -> None:
    """Put the live database back to the template's state (the episode's known start)."""
    from django.db import connections

    connections.close_all()
    copy_database(template, live_db)


def load_catalogue(data: dict[str, Any]) -> None:
    """Create the partner, products with stock records, customers, and the voucher through Oscar's models."""
    from django.contrib.auth import get_user_model
    from django.contrib.sites.models import Site
    from django.utils import timezone
    from oscar.apps.address.models import Country
    from oscar.apps.catalogue.models import Product, ProductClass
    from oscar.apps.partner.models import Partner, StockRecord

    Site.objects.update_or_create(id=1, defaults={"domain": "127.0.0.1", "name": "AgentFlow Oscar store"})
    country = data["country"]
    Country.objects.create(
        iso_3166_1_a2=country["code"], name=country["name"], printable_name=country["name"], is_shipping_country=True
    )
    partner = Partner.objects.create(name=data["partner"])
    product_class = ProductClass.objects.create(name=data["product_class"], requires_shipping=True, track_stock=True)
    for index, item in enumerate(data["products"]):
        product = Product.objects.create(
            title=item["title"], upc=item["upc"], product_class=product_class, structure="standalone", is_public=True
        )
        # The listing shows the newest first: the featured product is made the newest.
        Product.objects.filter(pk=product.pk).update(
            date_created=timezone.now() + timedelta(seconds=100 if item.get("featured") else index)
        )
        StockRecord.objects.create(
            product=product,
            partner=partner,
            partner_sku=item["upc"],
            price=Decimal(item["price"]),
            price_currency="GBP",
            num_in_stock=item["stock"],
        )
    user_model = get_user_model()
    for key, active in (("customer", True), ("blocked_customer", False)):
        person = data[key]
        user = user_model.objects.create_user(
            username=person["email"].split("@")[0],
            email=person["email"],
            password=person["password"],
            first_name=person["first_name"],
            last_name=person["last_name"],
        )
        user.is_active = active
        user.save()
    _create_voucher(data["voucher"])


def _create_voucher(spec: dict[str, Any]) -> None:
    from django.utils import timezone
    from oscar.apps.offer.models import Benefit, Condition, ConditionalOffer, Range
    from oscar.apps.voucher.models import Voucher

    product_range = Range.objects.create(name="Everything", includes_all_products=True)
    benefit = Benefit.objects.create(range=product_range, type=Benefit.PERCENTAGE, value=Decimal(spec["percent"]))
    condition = Condition.objects.create(range=product_range, type=Condition.COUNT, value=1)
    offer = ConditionalOffer.objects.create(
        name=spec["name"], offer_type=ConditionalOffer.VOUCHER, benefit=benefit, condition=condition
    )
    now = timezone.now()
    voucher = Voucher.objects.create(
        name=spec["name"],
        code=spec["code"],
        start_datetime=now - timedelta(days=1),
        end_datetime=now + timedelta(days=3650),
    )
    voucher.offers.add(offer)


def unit_price(price: str, price_factor: float) -> Decimal:
    """A catalogue price scaled by the scenario's price factor, to the penny."""
    return (Decimal(price) * Decimal(str(price_factor))).quantize(CENT, rounding=ROUND_HALF_UP)


def apply_scenario(scenario: dict[str, Any]) -> None:
    """What a variant changes in the store: featured stock (``inventory``), prices, the customer's account."""
    from django.contrib.auth import get_user_model
    from oscar.apps.partner.models import StockRecord

    data = catalogue()
    factor = float(scenario.get("price_factor", 1.0))
    for item in data["products"]:
        stock = int(scenario.get("inventory", item["stock"])) if item.get("featured") else item["stock"]
        StockRecord.objects.filter(partner_sku=item["upc"]).update(
            price=unit_price(item["price"], factor), num_in_stock=stock
        )
    blocked = scenario.get("user_tier") == "blocked"
    get_user_model().objects.filter(email=data["customer"]["email"]).update(is_active=not blocked)


def placed_order(scenario: dict[str, Any]) -> dict[str, Any]:
    """The customer's last order as Oscar stored it, checked against the catalogue and the scenario.

    ``verified`` holds when an order exists, every line's price is the catalogue price for this scenario,
    the order total is the sum of its lines plus shipping, and the stock of each line was allocated.
    """
    from oscar.apps.order.models import Order
    from oscar.apps.partner.models import StockRecord

    data = catalogue()
    prices = {p["upc"]: unit_price(p["price"], float(scenario.get("price_factor", 1.0))) for p in data["products"]}
    order = Order.objects.filter(user__email=data["customer"]["email"]).order_by("-id").first()
    if order is None:
        return {"orders": 0, "verified": 0}
    lines = [
        {"upc": line.upc, "quantity": line.quantity, "line_price_incl_tax": str(line.line_price_incl_tax)}
        for line in order.lines.all()
    ]
    expected = sum((prices[line["upc"]] * line["quantity"] for line in lines), Decimal("0")) + Decimal(
        order.shipping_incl_tax
    )
    allocated = all(
        StockRecord.objects.get(partner_sku=line["upc"]).num_allocated >= line["quantity"] for line in lines
    )
    lines_ok = bool(lines) and all(
        Decimal(line["line_price_incl_tax"]) == prices[line["upc"]] * line["quantity"] for line in lines
    )
    total_ok = Decimal(order.total_incl_tax) == expected
    return {
        "orders": Order.objects.filter(user__email=data["customer"]["email"]).count(),
        "number": order.number,
        "status": order.status,
        "lines": lines,
        "total_incl_tax": str(order.total_incl_tax),
        "expected_total": str(expected),
        "verified": int(lines_ok and total_ok and allocated),
    }
