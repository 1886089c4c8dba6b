"""Our quantity parser (resources.py) reads what the Kubernetes library's parse_quantity reads,
the same way, and refuses what apimachinery refuses."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from disttrain.builders.resources import quantity

NUMBERS = st.from_regex(r"\A[+-]?([0-9]{1,6}(\.[0-9]{0,4})?|\.[0-9]{1,4})\Z")
SUFFIXES = st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                            "e3", "E-2", "e+6"])


@given(NUMBERS, SUFFIXES)
def test_reads_what_the_kubernetes_library_reads(number: str, suffix: str) -> None:
    text = number + suffix
    assert quantity(text) == parse_quantity(text)


def test_numbers_and_what_is_no_quantity() -> None:
    assert quantity(2) == Decimal(2) and quantity(0.5) == Decimal("0.5") and quantity("500m") == Decimal("0.5")
    # "K", "ki" and a bare suffix are no quantity to apimachinery (the library takes "K").
    for text in ("a lot", "1K", "1ki", "Gi", "", "1 Gi", "1Gb", "--1"):
        assert quantity(text) is None, text
    assert quantity(True) is None and quantity(None) is None
