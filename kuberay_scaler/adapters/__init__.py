"""One adapter per external system."""
