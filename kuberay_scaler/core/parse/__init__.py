"""Pure, tolerant parsing of raw Kubernetes objects into the typed model.

GCS replies are read in the adapter (adapters/ray_gcs/state.py): the core never sees protobuf.
"""
