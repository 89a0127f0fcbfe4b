"""A probe script for the runner tests: holds its GPUs for a moment and reports when (monotonic clock, seconds),
so a test can tell whether two jobs ran on the same cards at once."""

import json
import os
import time

started = time.monotonic()
time.sleep(float(os.environ.get("SF_TEST_HOLD_S", "0.6")))
print("STACKFORGE_RESULT " + json.dumps({"status": "pass", "reason": "held its GPUs",
                                          "evidence": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
                                          "metrics": {"started": started, "ended": time.monotonic()}}),
      flush=True)
