"""Pure, frozen data: what the daemon knows about the cluster, Ray, and what it plans."""
