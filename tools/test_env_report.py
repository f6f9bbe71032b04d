#!/usr/bin/env python3
"""One line on the test environment before the suite runs: the torch build and the free disk.

A CI log that ends in hundreds of fixture errors is far easier to read when its first lines say
that torch came as a CUDA build (the local CPU wheel was missing, so pip took several GB from
PyPI) or that the disk the tests write to is nearly full. Warnings only: the suite decides.

    python tools/test_env_report.py [--after-install]
"""
import os
import shutil
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The suite's temporaries and model caches together take about 2 GB; below this, say so.
LOW_DISK_BYTES = 4 << 30


def _gib(n):
    return "%.1f GiB" % (n / (1 << 30))


def _tree_bytes(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total


def report(after_install):
    lines, warnings = [], []
    try:
        import torch
        cuda = torch.version.cuda
        lines.append("torch %s (%s)" % (torch.__version__, "CUDA %s build" % cuda if cuda else "CPU build"))
        if cuda:
            warnings.append("torch is a CUDA build: the CPU wheel was not found where pip looks, so pip "
                            "took the PyPI build with its CUDA libraries (several GB on disk)")
    except ImportError as e:
        lines.append("torch not importable (%s)" % e)
    if after_install:
        venv = os.path.join(ROOT, ".venv")
        lines.append(".venv %s" % _gib(_tree_bytes(venv)))
    for label, path in (("repo", ROOT), ("tmp", tempfile.gettempdir())):
        free = shutil.disk_usage(path).free
        lines.append("%s free %s" % (label, _gib(free)))
        if free < LOW_DISK_BYTES:
            warnings.append("only %s free under %s: the tests write models and KV files there and may "
                            "fail with 'No space left on device'" % (_gib(free), path))
    print("test environment: " + ", ".join(lines))
    for w in warnings:
        print("test environment WARNING: " + w)


if __name__ == "__main__":
    report("--after-install" in sys.argv[1:])
