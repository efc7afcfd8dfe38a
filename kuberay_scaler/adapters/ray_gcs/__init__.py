"""Ray GCS adapter: the only package that talks gRPC to Ray or reads its protobuf (docs/ray-gcs.md).

- `client`: `GcsClient`, the grpc.aio client (auth, TLS, cluster id, reconnect, metrics).
- `state`: `parse_ray_state`, a reply (message or proto3 JSON) → the core's `RayState`.
- `poller`: `GcsPoller` publishes parsed `RayObservation`s; unknown state is explicit.
- `unchanged`: a reply that differs from the last only in versions and idle clocks, unparsed.
- `adapter`: `RayGcs`, the loop's `Gcs` port (fresh read, drains, report) over plain data.
- `drain`: `drain_slice`, all hosts of a slice or none.
- `report`: `AutoscalingReport` → `AutoscalingState` for `ray status`.
- `errors`: `GcsError` and its kinds.

Import the module you need: this face imports nothing, so `plan` reading a captured reply
(`state`) does not load grpc. Each module imports `ray`'s generated protobuf (about a second and
~80 MB): keep them out of pure code (import-linter forbids the core `ray` and `google`).
"""
