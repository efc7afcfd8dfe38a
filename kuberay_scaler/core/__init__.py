"""The pure core: decisions without I/O."""
