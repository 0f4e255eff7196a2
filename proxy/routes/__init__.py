"""The HTTP routes: one module per API or endpoint family, and their request parsing.
A compacting API's module hands the pipeline its ``Api`` value (upstream/api.py)."""
