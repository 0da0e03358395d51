"""``python -m emqfast``: the same command line as the ``emqfast`` console script."""
from emqfast.tools.cli import main

if __name__ == "__main__":
    main()
