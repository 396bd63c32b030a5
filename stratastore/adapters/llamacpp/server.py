"""llama-cpp-python's OpenAI-compatible server with its model's cache on stratastore: the server
of ``python -m llama_cpp.server`` (llama-cpp-python 0.3.36, its ``server`` extra), its flags for
one model, and ``--strata_store``::

    python -m stratastore.adapters.llamacpp.server --model model.gguf --strata_store /var/lib/kv

Contract:

- The ``Llama`` the server loads gets a :class:`~.cache.StrataLlamaCache` on the store
  (``Llama.set_cache``): each completion's state is parked when the completion is served, and
  the deepest stored prefix of the next prompt is restored, validated, before llama.cpp
  evaluates the rest. The server's own ``cache`` / ``cache_type`` settings are replaced by it.
- One model, one store: llama-cpp-python's config file of several models (``--config_file``,
  ``CONFIG_FILE``) is refused; run a launcher a model, each with its own store (a store
  directory holds one model's K/V, spec F-DIR-6).
- ``--strata_store`` is a directory: the store is that directory, ``--strata_store_mib`` MiB of
  it (default :data:`DEFAULT_STORE_MIB`), each state durable when its completion returns
  (``park = "disk"``), prefixes restored to the last whole page (``page_resume``). Or a TOML
  file of the store's settings (docs/configuration.md), checked before the model is loaded.
- A restore is logged (``stratastore: restored N of M prompt tokens from the store``), and the
  store's counters (its INFO line, ``stratastore: strata: ...``) when the server stops.
- SIGTERM and SIGINT stop the server as llama-cpp-python's does: uvicorn lets the requests in
  progress finish (sse-starlette cancels a streamed one: its state is not parked), the store
  is closed (every parked state durable, its counters logged), then SIGTERM ends the process
  by that signal (uvicorn re-raises it) and SIGINT with status 0. A second signal during the
  shutdown skips it (uvicorn's forced exit): with a directory store every state it parked is
  durable already.
- ``--logits_all`` defaults to false here (llama-cpp-python's server keeps every token's
  logits by default): a restored prefix has no logits for its tokens, so llama-cpp-python
  refuses a request for logprobs rather than answer it wrong; given true, the adapter refuses
  the model at start.
- A bad store setting or a model the adapter cannot serve (docs/engine.md, "llama.cpp") is an
  ``error:`` line on stderr and exit status 2 before the server listens (a flag argparse does
  not know: its usage and exit status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.io.system import env_var

__all__ = ["main", "store_settings"]

#: by its name, not ``__name__``: run with ``python -m`` this module is ``__main__``
log = logging.getLogger("stratastore.adapters.llamacpp.server")

#: the store's budget when ``--strata_store`` is a directory
DEFAULT_STORE_MIB = 8192


def store_settings(spec: str, mib: int | None) -> dict[str, Any] | str:
    """What ``--strata_store`` names: a directory as the settings of a store on it (the module
    docstring), a TOML file's path as it is once it parses as the store's settings.
    :class:`ConfigError` for anything else."""
    if not spec.strip():
        raise ConfigError("--strata_store is empty: give the store's directory or TOML file")
    path = Path(spec)
    if path.is_dir() or (not path.exists() and path.suffix.lower() != ".toml"):
        budget = DEFAULT_STORE_MIB if mib is None else mib
        if budget <= 0:
            raise ConfigError(f"--strata_store_mib {budget}: give the store's MiB, above 0")
        return {
            "park": "disk",
            "ram_mib": 0,
            "cold_dir": str(path),
            "cold_mib": budget,
            "page_resume": True,
        }
    if path.suffix.lower() != ".toml":
        raise ConfigError(
            f"--strata_store {spec} is a file, not a directory or a .toml settings file"
        )
    if not path.is_file():
        raise ConfigError(
            f"--strata_store {spec}: no such TOML file; give the store's settings file or a "
            "directory"
        )
    if mib is not None:
        raise ConfigError(
            "--strata_store_mib is the budget of a directory store; give the levels' budgets "
            f"in {spec}"
        )
    StoreConfig.of(str(path))  # its errors now, not after the model's weights are read
    return str(path)


class _Caches:
    """The cache of the model the server holds (at most one: the server holds one model)."""

    def __init__(self, settings: dict[str, Any] | str) -> None:
        self.settings = settings
        self.current: Any = None

    def attach(self, llm: Any) -> Any:
        from stratastore.adapters.llamacpp.cache import StrataLlamaCache

        self.close()  # the server closed the model it replaces
        self.current = StrataLlamaCache(llm, self.settings)
        llm.set_cache(self.current)
        return llm

    def close(self) -> None:
        cache, self.current = self.current, None
        if cache is not None:
            log.info("stratastore: %s", cache.store.store.info_line())
            cache.close()


def _closing(lifespan: Any, caches: _Caches) -> Any:
    """``lifespan`` (the app's), then the store closed when the server shuts down: uvicorn
    runs it after the requests in progress and before it re-raises the SIGTERM or SIGINT that
    stopped it (the process then ends by that signal, as llama-cpp-python's server does)."""

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[Any]:
        try:
            async with lifespan(app) as state:
                yield state
        finally:
            caches.close()

    return run


def _parser(settings_model: Any) -> argparse.ArgumentParser:
    from llama_cpp.server.cli import add_args_from_model

    parser = argparse.ArgumentParser(
        prog="python -m stratastore.adapters.llamacpp.server",
        description="llama-cpp-python's OpenAI-compatible server, its model's cache on "
        "stratastore (the flags of python -m llama_cpp.server for one model, and "
        "--strata_store)",
    )
    add_args_from_model(parser, settings_model)
    parser.add_argument(
        "--strata_store",
        required=True,
        help="the store: a directory, or a TOML file of the store's settings",
    )
    parser.add_argument(
        "--strata_store_mib",
        type=int,
        default=None,
        help=f"the store's budget in MiB when --strata_store is a directory "
        f"(default {DEFAULT_STORE_MIB})",
    )
    return parser


def _log_to_stderr() -> None:
    """The adapter's log lines on stderr beside uvicorn's (INFO and up)."""
    logger = logging.getLogger("stratastore")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _error(e: Exception) -> None:
    """``e`` as one ``error:`` line (pydantic's validation errors span several)."""
    text = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    print(f"error: {text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.cli import parse_model_from_args
        from llama_cpp.server.model import LlamaProxy
        from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings
    except ImportError as e:
        print(
            f"error: the server needs llama-cpp-python's server extra ({e.name} is missing): "
            "pip install 'stratastore[llamacpp]'",
            file=sys.stderr,
        )
        return 2
    args = _parser(Settings).parse_args(argv)
    if args.logits_all is None:  # the server keeps every token's logits unless told not to
        args.logits_all = False
    _log_to_stderr()
    try:
        if env_var("CONFIG_FILE"):
            raise ConfigError(
                "CONFIG_FILE names a config file of several models: the launcher serves one "
                "model on one store; run one launcher a model, each with its own --strata_store"
            )
        caches = _Caches(store_settings(args.strata_store, args.strata_store_mib))
        server = parse_model_from_args(ServerSettings, args)
        model = parse_model_from_args(ModelSettings, args)
    except (StrataError, ValueError) as e:
        _error(e)
        return 2
    load = LlamaProxy.load_llama_from_model_settings

    def load_with_store(settings: Any) -> Any:
        return caches.attach(load(settings))

    LlamaProxy.load_llama_from_model_settings = staticmethod(load_with_store)
    try:
        try:
            app = create_app(server_settings=server, model_settings=[model])
        except (StrataError, ValueError) as e:  # the model the store cannot serve, a bad store
            _error(e)
            return 2
        app.router.lifespan_context = _closing(app.router.lifespan_context, caches)
        uvicorn.run(
            app,
            host=server.host,  # (the settings read HOST and PORT from the environment)
            port=server.port,
            ssl_keyfile=server.ssl_keyfile,
            ssl_certfile=server.ssl_certfile,
        )
    finally:
        LlamaProxy.load_llama_from_model_settings = staticmethod(load)
        caches.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
