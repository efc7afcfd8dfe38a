"""Every plan of the frozen fuzz corpus is byte-identical to the one recorded (plan_corpus.py):
a refactor that changes what the daemon writes or shows for any of them fails here."""

from __future__ import annotations

import json

from tests.fuzz.plan_corpus import inputs_of, load, plan_bytes


def test_every_plan_of_the_corpus_is_byte_identical_to_the_recorded_one() -> None:
    import hashlib

    cases = load()
    assert len(cases) >= 300, "the corpus lost cases"
    changed = []
    for index, case in enumerate(cases):
        shown = plan_bytes(*inputs_of(case))
        if hashlib.sha256(shown).hexdigest() != case["digest"]:
            changed.append((index, shown))
    if changed:
        index, shown = changed[0]
        first = json.dumps(json.loads(shown), indent=1, sort_keys=True)[:4000]
        raise AssertionError(
            f"{len(changed)} of {len(cases)} plans changed (first: case {index}); if the change "
            f"is intended: python -m tests.fuzz.plan_corpus --digests\n{first}"
        )
