"""Empty: see nvidia/dali/__init__.py."""
