"""The command line: run, plan, capture, check-config and the image's `ray` shim."""
