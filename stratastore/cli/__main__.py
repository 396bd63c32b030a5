"""``python -m stratastore.cli``: the ``strata`` command."""

from stratastore.cli.main import main

raise SystemExit(main())
