"""Fixtures of the TVM-parity tests; the helpers live in ``parity_harness.py`` (importable by name)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from parity_harness import run  # noqa: E402, F401  (the fixture, parametrized over every executor)
