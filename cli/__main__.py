"""`python -m ritrag.cli ...`: the `ritrag` command."""
import sys

from ritrag.cli import main

sys.exit(main())
