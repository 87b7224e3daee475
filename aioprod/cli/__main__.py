"""``python -m aioprod.cli``: the same as the ``aioprod`` console script."""

from aioprod.cli.main import main

main()
