"""The pure core: values in, values out; no I/O, clock, metrics or HTTP."""
