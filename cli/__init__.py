"""nvcli: the command line and the importable client (`cli.client.HotmountClient`).

The version is a literal (tests/cli/test_imports.py holds it equal to pyproject.toml's),
so `nvcli version` and the User-Agent need no `importlib.metadata`, which costs tens of
milliseconds at every start.
"""

__version__ = "0.1.0"
