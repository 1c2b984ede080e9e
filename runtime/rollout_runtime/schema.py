"""What a runtime model shares with the CRD generated from it: cross-field rules and the cluster's differences.

A runtime model (``DispatchPolicy``, ``ProbeSettings``) is the one source of its fields, bounds, defaults and
descriptions; the operator derives its CRD models from it. Two things a pydantic field cannot carry are stated here
as plain data, so that the model's own validator and the operator's CRD generator read the same statement:

- :class:`Comparison`: a rule between two fields (``timeout < period``). The model's validator checks it
  (:func:`rules_validator`); the CRD carries it as a CEL rule (:meth:`Comparison.cel`) with the same message.
- :class:`ClusterView`: where the Kubernetes object differs from the model (another default, a field a cluster
  object may not set, a tighter lower bound, a schema for what a Python validator checks, a field the model derives
  from another when it is unset and the object must therefore leave unset).

Pure: no I/O, no Kubernetes imports.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["ClusterView", "Comparison", "Op", "Requirement", "Rule", "check_rules", "rules_validator"]

Op = Literal["<", "<=", ">", ">="]

_HOLDS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_PHRASE: Final[dict[str, str]] = {
    "<": "must be less than",
    "<=": "must not exceed",
    ">": "must be greater than",
    ">=": "must be at least",
}
_FIX: Final[dict[str, tuple[str, str]]] = {
    "<": ("lower", "raise"),
    "<=": ("lower", "raise"),
    ">": ("raise", "lower"),
    ">=": ("raise", "lower"),
}

M = TypeVar("M", bound=BaseModel)


def _same(name: str) -> str:
    return name


@dataclass(frozen=True)
class Comparison:
    """``left <op> right`` between two fields of one model (snake_case names); unset (None) fields always pass.

    ``why`` completes the message with what goes wrong otherwise ("or probes of one target overlap"); the
    message also says what to change, so both the API server's and pydantic's errors tell the user what to fix.
    """

    left: str
    op: Op
    right: str
    why: str = ""

    def holds(self, left: Any, right: Any) -> bool:
        return left is None or right is None or _HOLDS[self.op](left, right)

    def message(
        self, *, name: Callable[[str], str] = _same, scope: str = "", values: Mapping[str, Any] | None = None
    ) -> str:
        """The error text, naming fields with ``name`` (prefixed ``scope.``) and showing ``values`` when given."""

        def subject(field_name: str) -> str:
            text = f"{scope}.{name(field_name)}" if scope else name(field_name)
            return f"{text} ({values[field_name]})" if values is not None else text

        why = f", {self.why}" if self.why else ""
        first, second = _FIX[self.op]
        return (
            f"{subject(self.left)} {_PHRASE[self.op]} {subject(self.right)}{why};"
            f" {first} {name(self.left)} or {second} {name(self.right)}"
        )

    def cel(self, *, scope: str, optional: Collection[str] = ()) -> dict[str, str]:
        """The rule as a CRD ``x-kubernetes-validations`` entry (camelCase names, reported at the left field).

        A field in ``optional`` may be absent from the object; the rule then holds, as it does for None here.
        """
        left, right = to_camel(self.left), to_camel(self.right)
        rule = f"self.{left} {self.op} self.{right}"
        guards = [f"!has(self.{to_camel(f)})" for f in (self.left, self.right) if f in optional]
        if guards:
            rule = " || ".join([*guards, f"({rule})"])
        return {"rule": rule, "message": self.message(name=to_camel, scope=scope), "fieldPath": f".{left}"}


@dataclass(frozen=True)
class Requirement:
    """``when == equals`` requires ``left <op> bound`` (a constant): a choice that only works with another setting.

    Checked by the model's validator and carried as a CEL rule, like :class:`Comparison`; ``why`` says what the
    choice would silently become otherwise.
    """

    when: str
    equals: str
    left: str
    op: Op
    bound: float
    why: str = ""

    @property
    def right(self) -> str:
        """The field whose value makes the rule apply (so messages can show both values, as a Comparison's do)."""
        return self.when

    def holds(self, left: Any, when: Any) -> bool:
        return when != self.equals or left is None or _HOLDS[self.op](left, self.bound)

    def message(
        self, *, name: Callable[[str], str] = _same, scope: str = "", values: Mapping[str, Any] | None = None
    ) -> str:
        def subject(field_name: str) -> str:
            text = f"{scope}.{name(field_name)}" if scope else name(field_name)
            return f"{text} ({values[field_name]})" if values is not None else text

        why = f", {self.why}" if self.why else ""
        when, bound = f"{scope + '.' if scope else ''}{name(self.when)}", f"{self.op} {self.bound:g}"
        return (
            f"{when}={self.equals!r} requires {subject(self.left)} {bound}{why};"
            f" set {name(self.left)} {bound} or change {name(self.when)}"
        )

    def cel(self, *, scope: str, optional: Collection[str] = ()) -> dict[str, str]:
        """The rule as a CRD ``x-kubernetes-validations`` entry, reported at the required field."""
        when, left = to_camel(self.when), to_camel(self.left)
        guards = [f"!has(self.{to_camel(f)})" for f in (self.when, self.left) if f in optional]
        rule = " || ".join([*guards, f"self.{when} != '{self.equals}'", f"self.{left} {self.op} {self.bound:g}"])
        return {"rule": rule, "message": self.message(name=to_camel, scope=scope), "fieldPath": f".{left}"}


Rule = Comparison | Requirement
"""A cross-field rule: both kinds are checked here and carried into the CRD as CEL."""


def check_rules(
    model: BaseModel, rules: Iterable[Rule], *, name: Callable[[str], str] = _same, show_values: bool = True
) -> None:
    """Raise ValueError with the message of the first rule ``model`` breaks (with the two values, by default)."""
    for rule in rules:
        values = {rule.left: getattr(model, rule.left), rule.right: getattr(model, rule.right)}
        if not rule.holds(values[rule.left], values[rule.right]):
            raise ValueError(rule.message(name=name, values=values if show_values else None))


def rules_validator(
    rules: tuple[Rule, ...], *, name: Callable[[str], str] = _same, show_values: bool = True
) -> Any:  # pydantic's decorator proxy type is private
    """A pydantic after-validator that checks ``rules``; assign it as ``_rules`` in a model (or in the namespace of
    a derived one: a subclass replaces the inherited validator by using the same name with other naming)."""

    def _rules(model: M) -> M:
        check_rules(model, rules, name=name, show_values=show_values)
        return model

    return model_validator(mode="after")(_rules)


@dataclass(frozen=True)
class ClusterView:
    """How a runtime model's Kubernetes object differs from the model; every field not named here is the model's.

    ``defaults``: another default in the object (the field is then never unset there). ``excluded``: fields an
    object may not set. ``minimum``: an inclusive lower bound replacing the model's. ``schema``: extra JSON schema
    per field, for what a Python validator checks and the API server cannot run (a pattern, a CEL rule).
    ``derived``: fields whose default the model computes from other fields when they are unset (a probe's timeout
    from its period): the object has no default for them, so the API server leaves them unset, the model's own
    derivation applies when the operator reads the object, and the rules hold while they are unset.
    """

    scope: str
    """The field's name in its parent object (``policy``, ``probe``): it prefixes rule messages."""
    rules: tuple[Rule, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    excluded: frozenset[str] = frozenset()
    minimum: Mapping[str, float] = field(default_factory=dict)
    schema: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    derived: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if clash := self.derived & (frozenset(self.defaults) | self.excluded):
            raise ValueError(f"derived fields {sorted(clash)} cannot also have a cluster default or be excluded")

    def changed(self) -> frozenset[str]:
        """Fields whose object version differs from the model's."""
        return frozenset(self.defaults) | frozenset(self.minimum) | frozenset(self.schema) | self.derived

    def object_default(self, wire: Mapping[str, Any]) -> dict[str, Any]:
        """An object's default (camelCase, as the API server stores it) without the derived fields, which the API
        server must leave unset for the model to derive them."""
        derived = {to_camel(name) for name in self.derived}
        return {key: value for key, value in wire.items() if key not in derived}
