"""Train: `python -m experiments.train --config=configs/longbench.py [--config.a.b=value]`."""

from absl import logging
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.",
                                          lock_config=True)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # Keep orbax / JAX start-up INFO lines off the console.
    from sparsebalance_jax.training import launch

    launch.request_host_devices(_CONFIG.value)
    launch.run(_CONFIG.value)


if __name__ == "__main__":
    cli.run(main)
