"""Bundled resources: icons, desktop integration files and small example state files."""
