"""The entry the experiments' commands share: absl's `app.run`, where a bad config or flag
ends the command with its message alone on stderr and exit status 2, not a traceback: a
ConfigError (which names the field), or a `--config.a.b=value` override of a field the config
does not have (ml_collections raises a bare KeyError / AttributeError for it)."""

import sys

from absl import app

from sparsebalance_jax.config import ConfigError


def _unknown_override(argv, error: Exception) -> tuple[str, str] | None:
    """The `--config.` override whose path holds the field `error` names, and ml_collections'
    "did you mean" hint (or ""), if any."""
    while error.args and isinstance(error.args[0], Exception):  # AttributeError(KeyError(..))
        error = error.args[0]
    key, _, hint = str(error.args[0] if error.args else "").partition("\n")
    key = key.strip("\"'")
    for arg in argv[1:]:
        path = arg.split("=", 1)[0]
        if path.startswith("--config.") and key in path.split(".")[1:]:
            return path, hint.strip()
    return None


def _stop(message: str) -> None:
    print(f"config error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def _parse_flags(argv):
    try:
        return app.parse_flags_with_usage(argv)
    except (KeyError, AttributeError) as e:
        found = _unknown_override(argv, e)
        if found is None:
            raise
        override, hint = found
        _stop(f"{override.removeprefix('--config.')}: the config has no such field "
              f"({override}){' - ' + hint if hint else ''}")


def run(main) -> None:
    def checked(argv):
        try:
            return main(argv)
        except ConfigError as e:
            _stop(str(e))

    app.run(checked, flags_parser=_parse_flags)
