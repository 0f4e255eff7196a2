"""The HTTP routes: one module per API or endpoint family, and request parsing."""
