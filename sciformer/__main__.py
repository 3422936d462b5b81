"""``python -m sciformer`` runs the command line."""

import sys

from sciformer.cli import main

sys.exit(main())
