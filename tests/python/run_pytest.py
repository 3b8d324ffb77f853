#!/usr/bin/env python3
"""ctest's entry to the Python tests: runs pytest on this folder, or exits 77 (ctest SKIP) with the
reason when this interpreter has no pytest. Extra arguments go to pytest."""

import pathlib
import sys

SKIP = 77

try:
    import pytest
except ImportError:
    print(f"SKIP: {sys.executable} has no pytest (Debian: apt-get install -y python3-pytest python3-numpy)")
    sys.exit(SKIP)

# Guarded: a test that starts processes with multiprocessing's spawn (test_sglang_tp_group.py)
# re-imports this module in each child as __mp_main__, which must not run pytest again.
if __name__ == "__main__":
    here = pathlib.Path(__file__).resolve().parent
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", str(here), *sys.argv[1:]]))
