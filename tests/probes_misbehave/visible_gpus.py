"""A probe script for the runner tests: reports which GPUs it was allowed to see (CUDA_VISIBLE_DEVICES)."""

import json
import os

seen = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
print("STACKFORGE_RESULT " + json.dumps({"status": "pass", "reason": "reported its GPUs", "evidence": seen}),
      flush=True)
