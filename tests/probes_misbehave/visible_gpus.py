"""A probe script for the runner tests: reports which GPUs it was allowed to see (CUDA_VISIBLE_DEVICES) and
in which order CUDA numbers them (CUDA_DEVICE_ORDER)."""

import json
import os

seen = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
print("STACKFORGE_RESULT " + json.dumps({"status": "pass", "reason": "reported its GPUs", "evidence": seen,
                                          "metrics": {"CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER",
                                                                                          "<unset>")}}),
      flush=True)
