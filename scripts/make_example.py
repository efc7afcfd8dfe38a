"""Write examples/v6e-16-pending (rc.yaml, pods.json, state.json) from the test fixtures.

    .venv/bin/python scripts/make_example.py

tests/unit/cli/test_readme_example.py fails when the files differ from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.examples import EXAMPLE, build


def main() -> int:
    EXAMPLE.mkdir(parents=True, exist_ok=True)
    for name, text in build().items():
        (EXAMPLE / name).write_text(text)
        print(EXAMPLE / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
