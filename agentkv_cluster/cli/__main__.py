"""``python -m agentkv_cluster.cli``: the same entry point as the ``agentkv`` script."""

from __future__ import annotations

import sys

from agentkv_cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
