"""Read a py-spy collapsed-stack profile (`--format raw`) of the daemon: where its time went.

    .venv/bin/python bench/pyspy_summary.py PROFILE [--top 15]

Prints, as shares of all samples: the issue-23 hot spots (inclusive: the function anywhere on
the stack), the top functions inclusive and by self time. Idle samples (the event loop waiting
in `select`/`epoll`) are counted apart, so shares are of the time the daemon was running.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

# The hot spots issue 23 named from its 10k profile (function names as py-spy prints them).
HOT_SPOTS = (
    "_add_launching",
    "_waiting_pods",
    "_pending_detail",
    "build_slice_map",
    "report_from_plan",
    "parse_ray_state",
    "ParseFromString",
    "FromString",
    "fingerprint",
)
_WAITING = re.compile(r"\b(select|poll|epoll_wait|_run_once|wait)\b \((selectors|threading)")
_FRAME = re.compile(r"^(?P<name>[^ ]+) \((?P<file>[^:]+)(:\d+)?\)$")


def read(path: Path) -> Counter[tuple[str, ...]]:
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks[tuple(frames.split(";"))] += int(count)
    return stacks


def _name(frame: str) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    file = match["file"].rsplit("/", 1)[-1]
    return f"{match['name']} ({file})"


def summary(stacks: Counter[tuple[str, ...]], top: int) -> dict[str, object]:
    total = sum(stacks.values())
    waiting = sum(n for s, n in stacks.items() if s and _WAITING.search(s[-1]))
    running = max(1, total - waiting)
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, n in stacks.items():
        if stack and _WAITING.search(stack[-1]):
            continue
        for name in {_name(f) for f in stack}:
            inclusive[name] += n
        if stack:
            own[_name(stack[-1])] += n

    def share(n: int) -> float:
        return round(100 * n / running, 1)

    hot = {
        spot: share(sum(n for name, n in inclusive.items() if name.startswith(spot + " ")))
        for spot in HOT_SPOTS
    }
    return {
        "samples": total,
        "running_share_pct": round(100 * running / max(1, total), 1),
        "hot_spots_pct_of_running": hot,
        "top_inclusive_pct": {k: share(n) for k, n in inclusive.most_common(top)},
        "top_self_pct": {k: share(n) for k, n in own.most_common(top)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(json.dumps(summary(read(args.profile), args.top), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
