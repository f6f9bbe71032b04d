"""Test dependencies are required, never optional: a missing one fails the test run with the
fix, instead of skipping the tests that would have caught a regression."""
import importlib

import pytest


def need(module):
    """Imports a test dependency from requirements-test.txt, or fails saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"the test dependency {module} is missing ({e}); run `make test`, which installs "
                    "requirements-test.txt into .venv, or use .venv/bin/python -m pytest", pytrace=False)
