"""What the running daemon needs around the core: settings, logs, metrics, memory."""
