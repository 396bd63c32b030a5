"""The ``strata`` command line, one module per command (borg's ``archiver/*_cmd.py``):

- :mod:`~stratastore.cli.main`: the parser, the global options, the dispatch;
- :mod:`~stratastore.cli.exit_codes`: the exit status of each error class, in one table;
- :mod:`~stratastore.cli.common`: what several commands share;
- the commands: :mod:`~stratastore.cli.demo`, :mod:`~stratastore.cli.inspect`,
  :mod:`~stratastore.cli.sim`, :mod:`~stratastore.cli.replay`, :mod:`~stratastore.cli.fsck`,
  :mod:`~stratastore.cli.conformance`, :mod:`~stratastore.cli.monitor`,
  :mod:`~stratastore.cli.init`, :mod:`~stratastore.cli.bench`.

``docs/cli.md`` lists the commands and the exit codes. Importing this package loads no harness
(``strata_harness``) and no operator tool beyond level discovery: each command imports
what it runs when it runs.
"""

from stratastore.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
