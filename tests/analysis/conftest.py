import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(HERE, "fixtures")
sys.path.insert(0, os.path.join(REPO, "analysis"))
sys.path.insert(0, os.path.join(REPO, "bench"))


def run_script(name, *args, cwd=None):
    """Runs analysis/NAME as the user would; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, os.path.join(REPO, "analysis", name), *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def fsdpq():
    """The CPU binary the tests drive (FSDPQ overrides; make builds ./fsdpq)."""
    path = os.environ.get("FSDPQ", os.path.join(REPO, "fsdpq"))
    assert os.access(path, os.X_OK), f"{path}: no fsdpq binary; build it first (make) or set FSDPQ"
    return path
