"""Shared pytest fixtures."""
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A running engine writes `.coli_usage` beside its model through a temporary it renames a moment
# later; tests that copy a model directory another test's engine is serving would race that
# rename. Every copytree in the suite leaves such temporaries out.
_copytree = shutil.copytree
_TRANSIENT = shutil.ignore_patterns(".coli_usage.tmp.*")


def _copytree_without_transients(src, dst, *args, ignore=None, **kwargs):
    def skip(path, names):
        return set(_TRANSIENT(path, names)) | (set(ignore(path, names)) if ignore else set())
    return _copytree(src, dst, *args, ignore=skip, **kwargs)


shutil.copytree = _copytree_without_transients


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


# The first few failures are printed the moment they happen, not only in the summary at the end:
# when a CI log is cut short, its head still names the cause (a fixture that cannot create its
# temporary directory fails every test after it in the same way).
_EARLY_REPORTS = 3
_early_reported = []


def pytest_runtest_logreport(report):
    if not report.failed or len(_early_reported) >= _EARLY_REPORTS:
        return
    _early_reported.append(report.nodeid)
    reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is None:
        return
    reporter.write_line("")
    reporter.write_line(f"--- first failures ({len(_early_reported)} of at most {_EARLY_REPORTS}): "
                        f"{report.nodeid} ({report.when})")
    for line in report.longreprtext.splitlines()[-40:]:
        reporter.write_line(line)


_config = None


def pytest_configure(config):
    global _config
    _config = config
