"""``python -m gradmon ...`` is the same as the ``gradmon`` console script."""

from gradmon.cli import main

raise SystemExit(main())
