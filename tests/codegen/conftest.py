"""Make ``kernel_cases`` importable from the code-generation tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
