"""``python -m deploy.cell_placement``: the planner's command line (deploy/README.md)."""

import sys

from deploy.cell_placement.cell_cli import main

if __name__ == "__main__":
    sys.exit(main())
