"""`nvcli`: hot-mount GPUs into running pods, from a laptop with a kubeconfig.

Wiring only: flags are parsed by typer (cli/app.py), the work is done by `cli.client`
(through the API server's aggregated API, or straight to an agent with `--agent`) or by
the engine in-process (`--local`). A plain `nvcli status` line is parsed and answered
without typer and click (cli/statusline.py): their import is a third of its start-up.
Exit codes, for scripts:

    0 success   1 error   2 usage or bad request   3 busy or conflict
    4 not found   5 unauthenticated or forbidden (or --local without root)   6 timeout

`nvcli list` exits 0 with the nodes that answered when some did not: each of those is a
`warning:` line on stderr, and an entry with `unavailable` in `-o json`/`-o yaml`.
"""

from __future__ import annotations

import sys

from cli.names import program_name


def main(argv: list[str] | None = None) -> int:
    """The `nvcli` and `kubectl-gpu` console scripts; returns (and exits with) the status."""
    name = program_name(sys.argv[0])
    args = sys.argv[1:] if argv is None else list(argv)
    if "status" in args:  # the other commands import nothing of the quick path
        from cli import statusline

        quick = statusline.parse(args, name)
        code = statusline.run(quick) if quick is not None else None
        if code is not None:
            return code
    from cli.app import run

    return run(args, name)


if __name__ == "__main__":
    sys.exit(main())
