"""`python -m fluvial.broker ...` is the `fluvial` command."""
import sys

from fluvial.broker.cli import main

sys.exit(main())
