"""The dashboard's JavaScript type-checks under `tsc --checkJs --strict` (its JSDoc types).
TypeScript is a test dependency only: installed with npm into build/node on first use."""
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPESCRIPT = "typescript@5.6.3"
PREFIX = ROOT / "build" / "node"
TSC = PREFIX / "node_modules" / ".bin" / "tsc"


def tsc():
    if not TSC.exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install TypeScript for this test (apt-get install npm)"
        r = subprocess.run([npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(PREFIX), TYPESCRIPT],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and TSC.exists(), f"npm could not install {TYPESCRIPT}:\n{r.stderr[-2000:]}"
    return TSC


def test_dashboard_javascript_type_checks():
    r = subprocess.run([str(tsc()), "-p", str(ROOT / "tests" / "tsconfig.web.json")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
