"""Pure: a Plan and the RayCluster it was made from → guarded RFC 6902 JSON-patch operations."""
