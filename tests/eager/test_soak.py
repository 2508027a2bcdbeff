"""Soak (tests/contract/soak.py), eager engine: many cycles per mode with
flat memory, no function traced after the warm-up, no leaked objects."""

from tests.contract.soak import StoreSoakTest  # noqa: F401
