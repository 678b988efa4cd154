"""Build the default model (``make model``): rufus/launch/default_model.py.

    python scripts/build_model.py [--out DIR] [--force]
"""

from rufus.launch.default_model import main

if __name__ == "__main__":
    raise SystemExit(main(doc=__doc__))
