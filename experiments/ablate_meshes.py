"""Mesh ablation: step time, tokens/s, peak memory and compile time of one config per mesh.

    python -m experiments.ablate_meshes --config=configs/longbench.py \\
        --meshes=8x1x1,1x8x1,2x2x2,1x4x2,4x1x2 --steps=5 --warmup=2 --out=runs/ablate_meshes

Meshes are data x fsdp x tensor and must all use the same number of devices (on CPU, that many
host devices are created; on GPUs, it must be the number present). Without --meshes the
config's own mesh is measured. Writes meshes.md and meshes.json under --out.
"""

from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.",
                                          lock_config=True)
_MESHES = flags.DEFINE_string("meshes", None, "Comma-separated DATAxFSDPxTENSOR meshes; "
                              "default: the config's mesh.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per mesh (the median is reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps after the first (compiling) one.")
_OUT = flags.DEFINE_string("out", "runs/ablate_meshes", "Output directory.")


def main(argv):
    del argv
    from sparsebalance_jax.sharding import ablation

    raw = _CONFIG.value
    results = ablation.run_ablation(raw, ablation.meshes_to_run(_MESHES.value, raw),
                                    steps=_STEPS.value,
                                    warmup=_WARMUP.value)
    title = (f"Mesh ablation ({results[0].backend}, {results[0].device_kind}): preset "
             f"{raw.preset}, {_STEPS.value} timed steps after {_WARMUP.value} warm-up")
    meta = dict(config=raw.to_dict(), steps=_STEPS.value, warmup=_WARMUP.value)
    for path in ablation.write_results(_OUT.value, results, meta, title):
        print(f"wrote {path}")


if __name__ == "__main__":
    cli.run(main)
