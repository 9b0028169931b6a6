"""nvcli: the command line and the importable client (`cli.client.HotmountClient`)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpu-hotmount")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
