"""Shared fixtures.  Each area keeps its heavy fixtures in its own module (``fixtures_*.py``)
so that fixtures can be shared (e.g. the real Slurm) without files being edited by everyone."""
import importlib.util
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
# The repository's schema: the shared contract plus the fields this project added (status).
SCHEMA_PATH = HERE.parent / "reveal_plugins" / "report" / "report.schema.json"
SHARED_SCHEMA_PATH = HERE.parent.parent / "shared" / "report.schema.json"

for _p in sorted(HERE.glob("fixtures_*.py")):
    _mod = importlib.import_module(_p.stem)
    globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("_")})
