"""Make the shared helpers in ``op_testing.py`` importable from every test module in ``tests/ops``."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
