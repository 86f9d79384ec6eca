"""rules.queueing: the queue rule's paths are tried in their declared order. Its verdicts are in
test_verdicts_hold.py, test_verdicts_real.py and tests/thirdparty."""

from __future__ import annotations


def test_the_queue_rules_paths_are_tried_in_their_declared_order() -> None:
    """The engine's queue time first; the client's sweep, then one level (in line, at the cap); the long
    ramp's limit in requests only when it showed one, and then it alone answers."""
    from rules.base import REGISTRY, checks_of
    from rules.long_ramp import LONG_RAMP
    from rules.queueing import AT_CAP, SINGLE_LEVEL, SWEEP

    assert [c.id for c in checks_of("queue")] == ["queue.spans", "queue.sweep", "queue.in_line", "queue.at_cap",
                                                  "queue.request_limit"]
    assert REGISTRY["queue"].needs == (("queue_share_tail",), SWEEP, SINGLE_LEVEL, AT_CAP, LONG_RAMP)
