"""``python -m topas.cli``: the ``topas`` command line."""

from topas.cli import main

main()
