"""Helpers shared by the bench/*.py commands (pages, a fake vLLM fleet, an exporter harness).

Kept in a sub-package so `make bench` (which runs bench/*.py) does not run them."""
