"""The HTTP routes: one module per API or endpoint family, their request parsing, and
the Route an API hands the pipeline."""
