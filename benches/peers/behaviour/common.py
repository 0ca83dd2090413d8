"""What the Python behaviour runs share: the scenarios' names and how a finding is printed (one
JSON line each, read by benches/peers/run.py)."""

import json
import sys

SCENARIOS = {
    "double_click": "Double click: two concurrent submits of one key (20 trials, fresh key each)",
    "different_payload": "Same key, different payload",
    "while_running": "Same key again while the first job is running",
    "after_finished": "Same key again after the job finished",
    "worker_timeout": "The worker hangs past its timeout",
    "late_result": "The timed-out worker reports after all",
}
TRIALS = 20
P1 = {"prompt": "a cat in a hat", "size": 512}
P2 = {"prompt": "a dog in a fog", "size": 512}


def report(system, scenario, observed, **facts):
    assert scenario in SCENARIOS, scenario
    print(json.dumps({"system": system, "scenario": scenario, "observed": observed, "facts": facts}), flush=True)


def fail(system, scenario, err):
    report(system, scenario, f"the run itself failed: {err!r}")
    print(f"{system} {scenario}: {err!r}", file=sys.stderr)
