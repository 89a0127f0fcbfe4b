"""A probe script that never finishes (for the runner's timeout path): it logs, then sleeps."""

import sys
import time

print("hang probe: starting, about to sleep forever", flush=True)
print("hang probe: this line is the last output", file=sys.stderr, flush=True)
while True:
    time.sleep(3600)
