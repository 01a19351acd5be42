"""specwatch: observability and decisions for speculative decoding in LLM serving."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("specwatch")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+src"
