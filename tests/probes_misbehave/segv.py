"""A probe script that dies by SIGSEGV after printing some log lines (for the runner's crash path)."""

import os
import signal
import sys

print("segv probe: line 1", flush=True)
print("segv probe: line 2 (stderr)", file=sys.stderr, flush=True)
print("segv probe: about to raise SIGSEGV", flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
