"""Shared pytest fixtures."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def oracle_root():
    """Build (or reuse, when the stamp matches) the tiny transformers oracles; yield their root."""
    import make_oracles
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        pytest.fail(f"oracle generation needs torch and transformers ({e}); run `make test`, "
                    "which installs requirements-test.txt into .venv", pytrace=False)
    yield make_oracles.generate(quiet=True)
