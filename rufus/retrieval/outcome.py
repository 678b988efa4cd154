"""What a search returns (:class:`SearchOutcome`) and what one of its steps found
(:class:`Found`). Apart from the search so that its steps (rufus/retrieval/search.py,
rufus/retrieval/typed_search.py) share them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from rufus.retrieval.base import Filters
from rufus.retrieval.catalog import Product
from rufus.retrieval.constraints import Constraint


@dataclass(frozen=True)
class SearchOutcome:
    """The grounded search's result: the cards, what was searched, and what the customer is
    told about it (system-written ``notes``)."""

    products: list[Product]
    queries: list[str]  # the queries finally searched (after grounding / spelling)
    filters: Filters  # the filters finally applied
    corrected: dict[str, str] = field(default_factory=dict)  # typo -> correction applied
    relaxed: list[str] = field(default_factory=list)  # plan filters dropped, "brand" before "max_price"
    notes: list[str] = field(default_factory=list)  # customer-facing, system-written
    requested: Filters = field(default_factory=Filters)  # the grounded filters before relaxing
    categories: list[str] = field(default_factory=list)  # product types searched (empty: any)
    constraints: list[Constraint] = field(default_factory=list)  # stated, and met by every card
    dropped: list[Constraint] = field(default_factory=list)  # stated, relaxed: no card met them
    models: list[str] = field(default_factory=list)  # the models the question names, in order


@dataclass(frozen=True)
class Found:
    """What one search step found, with what it adds to the grounding's notes and
    corrections; the search writes the outcome's notes once, from these, at the end."""

    products: list[Product]
    queries: list[str]
    filters: Filters
    relaxed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # this step's, after the grounding's
    corrected: dict[str, str] = field(default_factory=dict)  # this step's own corrections
    # the plan's brand "typo" was no typo ("razr" is not Razer): its correction and note go
    retract_brand: bool = False
    requested: Filters | None = None  # the filters stated, when the step states more (types)
    categories: list[str] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    dropped: list[Constraint] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
