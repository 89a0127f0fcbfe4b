"""Following upstream: ``stackforge watch`` reads what the index uploaded since the last watch."""
