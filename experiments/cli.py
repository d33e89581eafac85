"""The entry the experiments' commands share: absl's `app.run`, where a bad config or flag
(a ConfigError, which names the field) ends the command with its message alone on stderr and
exit status 2, not a traceback."""

import sys

from absl import app

from sparsebalance_jax.config import ConfigError


def run(main) -> None:
    def checked(argv):
        try:
            return main(argv)
        except ConfigError as e:
            print(f"config error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)

    app.run(checked)
