"""Make ``aot_harness`` and the shared ``programs`` suite importable from the AOT tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
