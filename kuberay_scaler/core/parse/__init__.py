"""Pure, tolerant parsing of raw API objects and GCS replies into the typed model."""
