"""`python -m mcp_durable.cli …`: the `mcp-durable` command."""

import sys

from .commands import main

sys.exit(main())
