"""Load balancing across data shards: latency model, tuner, budget buckets, compile cache.

Modules: latency (predicted time of a packed micro-batch at a MoBA budget, profiled tables,
per-shard EMA correction), profiling (measuring a table for one decoder layer), timing (how a
jitted call is timed), tuner (dynamic sparsity tuning: per-shard budgets and the bucket rule),
compile_cache (one compiled step per budget bucket, counted), simulate (simulated data
parallelism on one device: the straggler benchmark), report (its PNG and table). Import from
the modules.
"""
