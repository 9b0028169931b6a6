"""nvcli commands, one module a verb; cli/main.py registers them."""
