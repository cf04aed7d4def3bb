"""Operator registry: adding an operator means adding one module and one entry here."""

from __future__ import annotations

from collections.abc import Callable

from tik_evo.operators.base import Operator
from tik_evo.operators.knob import KnobOperator


def _llm() -> Operator:
    from tik_evo.operators.llm import LLMOperator  # litellm is imported lazily, only when used

    return LLMOperator()


OPERATORS: dict[str, Callable[[], Operator]] = {"knob": KnobOperator, "llm": _llm}


def make_operator(name: str) -> Operator:
    return OPERATORS[name]()
