"""What the agent and nvcli agree on: the one package both import, and that imports
neither (pyproject.toml's import-linter contracts hold it to that).

- `schemas`: the request and response models, and the `Status` error body (pydantic);
- `errors`: exit codes, a `Status`'s client exception, default reasons (no pydantic:
  nvcli imports it at start);
- `results`: the engine's results and errors as the wire shows them, shared by the
  agent and `nvcli --local` so that both answer alike;
- `tables`: the text of the aggregated API's Tables and of holders;
- `durations`: `30m`, `1h30m`, parsed and printed alike on both sides.

This file imports nothing: nvcli's start-up pays only for the modules it names.
"""
