"""The loop: wakeups, expectations, backoff, drains and writes. It decides nothing itself."""
