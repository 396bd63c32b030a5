"""stratastore's harnesses, apart from the library: the benchmarks and peers behind ``strata
bench``, the simulator behind ``strata sim``, the replay behind ``strata replay`` and the demo
behind ``strata demo``. They ship in the same distribution; the CLI imports them lazily, so an
engine importing ``stratastore`` never loads them. They use the library's public API and, where
a benchmark measures one layer, that layer's modules."""
