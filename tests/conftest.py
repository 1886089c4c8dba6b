"""Shared test setup: the repo's hack/ on the path (the local control plane lives there)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hack"))
sys.path.insert(0, str(ROOT / "tests"))
