"""Benchmarks, peers, the simulator, the replay and the demo behind ``strata bench``, ``strata
sim``, ``strata replay`` and ``strata demo``. The CLI imports these lazily: an engine importing
the library never loads them."""
